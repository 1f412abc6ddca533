//! Per-rank views of an arena's host words.

use std::slice::{Chunks, ChunksMut};

use super::{Arena, host_words, host_words_mut};
use crate::error::Result;

/// The words of each rank of `arena` (a `RuntimeError` for an arena on a GPU device).
pub(in crate::backend) fn rank_slices(arena: &Arena) -> Result<Chunks<'_, u32>> {
    let rank_words = arena.format().words_for(arena.rank_len()).max(1);
    Ok(host_words(arena)?.chunks(rank_words))
}

/// The words of each rank of `arena`, to write (a `RuntimeError` for an arena on a GPU device).
pub(in crate::backend) fn rank_slices_mut(arena: &mut Arena) -> Result<ChunksMut<'_, u32>> {
    let rank_words = arena.format().words_for(arena.rank_len()).max(1);
    Ok(host_words_mut(arena)?.chunks_mut(rank_words))
}

/// `Some(slice)` per rank of an optional arena ([`rank_slices_mut`]), or `None` per rank, for
/// `ranks` ranks.
pub(in crate::backend) fn optional_rank_slices(
    arena: Option<&mut Arena>,
    ranks: usize,
) -> Result<Vec<Option<&mut [u32]>>> {
    Ok(match arena {
        Some(a) => rank_slices_mut(a)?.take(ranks).map(Some).collect(),
        None => (0..ranks).map(|_| None).collect(),
    })
}
