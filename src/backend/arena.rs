//! [`Arena`]: the replicas of a list of parameters in one storage format, on the host or a GPU
//! device, and the layout of parameters in it.

use std::fmt;

use super::cpu::host_words::HostWords;
use super::gpu::GpuArena;
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// Every parameter's first element in an arena sits at a multiple of this many elements, so
/// that 16-bit parameters start on a word and copies stay 4-byte aligned.
pub const PARAM_ALIGN_ELEMENTS: usize = 64;

/// One arena: the elements of `ranks` replicas of a list of parameters, all stored in one
/// format, laid out `[rank][element]` with `rank_len` elements per rank. Parameters are views
/// (offset, length) into the rank's element space, at [`PARAM_ALIGN_ELEMENTS`] boundaries.
///
/// A backend may store a large arena as several chunks (each a separate binding); the
/// `chunk_len` elements of every rank that form one chunk are then stored together. Arenas
/// that take part in one kernel share `rank_len` and `chunk_len`.
pub struct Arena {
    format: StorageFormat,
    ranks: usize,
    rank_len: usize,
    chunk_len: usize,
    pub(crate) storage: ArenaStorage,
}

pub(crate) enum ArenaStorage {
    Host(HostWords),
    Gpu(GpuArena),
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("format", &self.format)
            .field("ranks", &self.ranks)
            .field("rank_len", &self.rank_len)
            .field("chunk_len", &self.chunk_len)
            .field(
                "on",
                &match self.storage {
                    ArenaStorage::Host(_) => "host",
                    ArenaStorage::Gpu(_) => "gpu",
                },
            )
            .finish()
    }
}

impl Arena {
    pub(crate) fn new(
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
        storage: ArenaStorage,
    ) -> Arena {
        Arena {
            format,
            ranks,
            rank_len,
            chunk_len,
            storage,
        }
    }

    /// The storage format of every element.
    pub fn format(&self) -> StorageFormat {
        self.format
    }

    /// Number of replicas.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Elements per rank (a multiple of [`PARAM_ALIGN_ELEMENTS`]).
    pub fn rank_len(&self) -> usize {
        self.rank_len
    }

    /// Elements per rank in one chunk (equal to `rank_len` for an unchunked arena).
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    /// Whether the arena lives on a GPU device (`false`: in host memory).
    pub fn is_on_device(&self) -> bool {
        matches!(self.storage, ArenaStorage::Gpu(_))
    }

    /// Bytes the arena occupies.
    pub fn bytes(&self) -> usize {
        self.ranks * self.rank_len * self.format.element_bytes()
    }

    /// Writes `words` (packed in this arena's format) at element `offset` of rank `rank`.
    /// `offset` must be a multiple of the format's elements per word.
    ///
    /// # Errors
    /// A `ValueError` when `rank` is out of range, `offset` lies beyond the rank's elements or is
    /// not word aligned, or `words` run past the end of the rank. A write to a GPU arena is queued:
    /// a device error surfaces at a later call.
    pub fn write(&mut self, rank: usize, offset: usize, words: &[u32]) -> Result<()> {
        // Padding elements may be written with the last word: clamp to the rank's length.
        let elements = words.len() * 4 / self.format.element_bytes();
        self.check_range(
            rank,
            offset,
            elements.min(self.rank_len.saturating_sub(offset)),
        )?;
        if !self.format.is_word_aligned(offset) {
            return Err(Error::value(format!(
                "arena write at element {offset} is not word aligned"
            )));
        }
        let rank_words = self.format.words_for(self.rank_len);
        let first = self.format.word_of(offset);
        if first + words.len() > rank_words {
            return Err(Error::value(format!(
                "arena write of {} words at element {offset} overruns the rank's {rank_words} words",
                words.len()
            )));
        }
        match &mut self.storage {
            ArenaStorage::Host(host) => {
                let start = rank * rank_words + first;
                host[start..start + words.len()].copy_from_slice(words);
            }
            ArenaStorage::Gpu(arena) => arena.write(rank, first, words),
        }
        Ok(())
    }

    /// Reads every rank back: `ranks * words_for(rank_len)` words, rank-major.
    ///
    /// # Errors
    /// A `RuntimeError` when a host arena's copy does not fit the memory budget, or when a GPU
    /// readback fails (a device error, a lost device).
    pub async fn read_all(&self) -> Result<Vec<u32>> {
        match &self.storage {
            ArenaStorage::Host(host) => {
                crate::budget::check(host.len().saturating_mul(4), "an arena's readback")?;
                Ok(host.to_vec())
            }
            ArenaStorage::Gpu(arena) => arena.read_all().await,
        }
    }

    /// Reads `len` elements of rank `rank` from element `offset` (word aligned); the words
    /// returned start with element `offset`.
    ///
    /// # Errors
    /// A `ValueError` when `rank` is out of range, `offset + len` exceeds the rank's elements or
    /// `offset` is not word aligned; a `RuntimeError` when a GPU readback fails (a device error, a lost device).
    pub async fn read_range(&self, rank: usize, offset: usize, len: usize) -> Result<Vec<u32>> {
        self.check_range(rank, offset, len)?;
        let first = self.format.word_of(offset);
        let words = self.format.words_for(len);
        match &self.storage {
            ArenaStorage::Host(host) => {
                let start = rank * self.format.words_for(self.rank_len) + first;
                Ok(host[start..start + words].to_vec())
            }
            ArenaStorage::Gpu(arena) => arena.read_range(rank, first, words).await,
        }
    }

    /// A `ValueError` unless rank `rank` has elements `offset..offset + len` and `offset` is
    /// word aligned.
    pub(crate) fn check_range(&self, rank: usize, offset: usize, len: usize) -> Result<()> {
        if rank >= self.ranks
            || offset
                .checked_add(len)
                .is_none_or(|end| end > self.rank_len)
        {
            return Err(Error::value(format!(
                "arena access out of range: rank {rank}, elements {offset}..{} of an arena with {} ranks of {} elements",
                offset.saturating_add(len),
                self.ranks,
                self.rank_len
            )));
        }
        // 16-bit formats pack two elements per word: every access starts on a word.
        if !self.format.is_word_aligned(offset) {
            return Err(Error::value(format!(
                "arena access at element {offset} is not word aligned"
            )));
        }
        Ok(())
    }
}

/// Lays out parameters of the given element counts in one rank's element space: returns each
/// parameter's offset and the padded rank length.
pub fn layout_params(numels: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = Vec::with_capacity(numels.len());
    let mut next = 0usize;
    for &n in numels {
        offsets.push(next);
        next += n.div_ceil(PARAM_ALIGN_ELEMENTS) * PARAM_ALIGN_ELEMENTS;
    }
    (offsets, next.max(PARAM_ALIGN_ELEMENTS))
}

/// The host words of `arena` (a `RuntimeError` for an arena on a GPU device).
pub(crate) fn host_words(arena: &Arena) -> Result<&[u32]> {
    match &arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the host",
        )),
    }
}

/// The host words of `arena`, to write (a `RuntimeError` for an arena on a GPU device).
pub(crate) fn host_words_mut(arena: &mut Arena) -> Result<&mut [u32]> {
    match &mut arena.storage {
        ArenaStorage::Host(words) => Ok(words),
        ArenaStorage::Gpu(_) => Err(Error::runtime(
            "this arena lives on a GPU device, not on the host",
        )),
    }
}

/// One element range to copy between arenas (see [`super::Backend::copy_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyRegion {
    /// Source rank.
    pub src_rank: usize,
    /// First source element (word aligned).
    pub src_offset: usize,
    /// Destination rank.
    pub dst_rank: usize,
    /// First destination element (word aligned).
    pub dst_offset: usize,
    /// Elements to copy.
    pub len: usize,
}
