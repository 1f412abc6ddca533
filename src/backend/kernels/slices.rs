//! Per-rank views of an arena's host words.

/// `Some(slice)` per rank, or `None` per rank.
pub(in crate::backend) fn optional_rank_slices(
    words: Option<&mut [u32]>,
    rank_words: usize,
    ranks: usize,
) -> Vec<Option<&mut [u32]>> {
    match words {
        Some(w) => w
            .chunks_mut(rank_words.max(1))
            .take(ranks)
            .map(Some)
            .collect(),
        None => (0..ranks).map(|_| None).collect(),
    }
}
