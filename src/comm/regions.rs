//! A broadcast of [`BroadcastRegion`]s between the worlds that hold one rank per process
//! (`MpiWorld`, `NatsWorld`): the words the root sends and what every other rank does with them
//! ([`broadcast`]), each world moving the words over its own transport. Regions are word
//! aligned, so a region's elements are whole words of its row.

use super::BroadcastRegion;
use crate::backend::Arena;
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::transfer;

/// One rank's part of a broadcast's transfer: the words the root sends, or how many words
/// another rank receives.
pub(crate) enum Words {
    /// On the root: its words, in [`words_to_send`]'s order.
    Send(Vec<u32>),
    /// On every other rank: the number of words to receive.
    Receive(usize),
}

/// [`Communicator::broadcast_regions`](super::Communicator::broadcast_regions) on `rank`, a
/// process's one rank, from `root`: the root reads its words from `src`, every other rank
/// checks that the regions fit `dst` before anything is received; `transport` moves them (it
/// gets this rank's [`Words`] and returns the words received, which the root does not use);
/// every other rank writes them into `dst`. Returns the bytes moved, as
/// [`CommStats`](super::CommStats) counts them ([`bytes_of`]).
///
/// # Errors
/// Those of [`words_to_send`] on the root, of [`check_destination`] and [`write_received`]
/// elsewhere; the transport's.
pub(crate) fn broadcast(
    src: Option<&Arena>,
    dst: &mut Arena,
    (root, rank): (usize, usize),
    regions: &[BroadcastRegion],
    transport: impl FnOnce(Words) -> Result<Vec<u32>>,
) -> Result<u64> {
    let format = dst.format();
    if root == rank {
        transport(Words::Send(words_to_send(src, root, format, regions)?))?;
    } else {
        check_destination(dst, regions)?;
        let words = transport(Words::Receive(words_of(format, regions)))?;
        write_received(dst, regions, &words)?;
    }
    Ok(bytes_of(format, regions))
}

/// The words of `regions` in order, as root `root` sends them, read from `src` (its source
/// arena, of `format`): one readback per source rank (from a GPU arena) covering its regions,
/// then each region from it.
///
/// # Errors
/// A `RuntimeError` when the root holds no source; a `ValueError` when the source's format is
/// not `format`; those of the readback.
fn words_to_send(
    src: Option<&Arena>,
    root: usize,
    format: StorageFormat,
    regions: &[BroadcastRegion],
) -> Result<Vec<u32>> {
    let src =
        src.ok_or_else(|| Error::runtime(format!("rank {root} broadcasts but holds no source")))?;
    if src.format() != format {
        return Err(Error::value(format!(
            "cannot broadcast {:?} elements into a {format:?} arena",
            src.format()
        )));
    }
    let mut ranks: Vec<usize> = regions.iter().map(|r| r.src_rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut staged = Vec::with_capacity(ranks.len());
    for rank in ranks {
        let mine = regions.iter().filter(|r| r.src_rank == rank);
        let start = mine.clone().map(|r| r.src_offset).min().unwrap_or(0);
        let end = mine.map(|r| r.src_offset + r.len).max().unwrap_or(0);
        let span = transfer::read_row_words(src, rank, start, end - start)?;
        staged.push((rank, start, span));
    }
    let mut words = Vec::with_capacity(words_of(format, regions));
    for r in regions {
        let (_, start, span) = staged
            .iter()
            .find(|(rank, _, _)| *rank == r.src_rank)
            .ok_or_else(|| Error::runtime("source rank not staged"))?;
        let first = format.word_of(r.src_offset) - format.word_of(*start);
        words.extend_from_slice(&span[first..first + format.words_for(r.len)]);
    }
    Ok(words)
}

/// The words `regions` of `format` take.
fn words_of(format: StorageFormat, regions: &[BroadcastRegion]) -> usize {
    regions.iter().map(|r| format.words_for(r.len)).sum()
}

/// Checks that every region fits `dst`, before anything is received.
fn check_destination(dst: &Arena, regions: &[BroadcastRegion]) -> Result<()> {
    regions
        .iter()
        .try_for_each(|r| dst.check_range(0, r.dst_offset, r.len))
}

/// Writes the received `words` (as [`words_to_send`] ordered them) into `dst`'s regions.
fn write_received(dst: &mut Arena, regions: &[BroadcastRegion], words: &[u32]) -> Result<()> {
    let format = dst.format();
    let mut k = 0;
    for r in regions {
        let n = format.words_for(r.len);
        dst.write(0, r.dst_offset, &words[k..k + n])?;
        k += n;
    }
    Ok(())
}

/// The bytes a broadcast of `regions` of `format` moves, as [`CommStats`](super::CommStats)
/// counts them (elements, not words).
fn bytes_of(format: StorageFormat, regions: &[BroadcastRegion]) -> u64 {
    regions
        .iter()
        .map(|r| (r.len * format.element_bytes()) as u64)
        .sum()
}
