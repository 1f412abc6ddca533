//! One format bucket of a [`Replicas`](super::Replicas): the parameters of one storage format,
//! their parameter and gradient arenas and their layout, and where each parameter lives.

use crate::backend::kernels::ParamStarts;
use crate::backend::{Arena, Backend};
use crate::dtype::StorageFormat;
use crate::error::Result;

/// Which of a bucket's two arenas: the parameters or their gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// The parameters.
    Params,
    /// The gradients (`.grad`).
    Grads,
}

/// Where parameter `j` of a [`Replicas`](super::Replicas) lives: its format bucket and its
/// element range in every rank's row of that bucket's arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamPlace {
    /// Index into [`Replicas::buckets`](super::Replicas::buckets).
    pub bucket: usize,
    /// First element of the parameter in a rank's row.
    pub offset: usize,
    /// Its element count.
    pub numel: usize,
}

/// The parameters of one storage format: their arenas (one row per rank, the parameters
/// packed in `members` order) and that layout.
#[derive(Debug)]
pub struct FormatBucket {
    format: StorageFormat,
    members: Vec<usize>,
    starts: ParamStarts,
    rank_len: usize,
    chunk_len: usize,
    params: Arena,
    grads: Arena,
}

impl FormatBucket {
    /// A bucket of `members` (global parameter indices) whose rows start each parameter at
    /// `offsets`, with zero-filled arenas of `ranks` rows on `backend`.
    pub(super) fn allocate(
        backend: &dyn Backend,
        format: StorageFormat,
        members: Vec<usize>,
        offsets: &[usize],
        rank_len: usize,
        ranks: usize,
    ) -> Result<FormatBucket> {
        let chunk_len = backend.chunk_len(rank_len, ranks);
        Ok(FormatBucket {
            format,
            starts: ParamStarts(offsets.iter().map(|&o| o as u32).collect()),
            members,
            rank_len,
            chunk_len,
            params: backend.create_arena(format, ranks, rank_len, chunk_len)?,
            grads: backend.create_arena(format, ranks, rank_len, chunk_len)?,
        })
    }

    /// The storage format of every arena of the bucket.
    pub fn format(&self) -> StorageFormat {
        self.format
    }

    /// The global indices of the bucket's parameters, in row order.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// Where each member starts in a row (the kernels' parameter table).
    pub fn starts(&self) -> &ParamStarts {
        &self.starts
    }

    /// Elements in one rank's row.
    pub fn rank_len(&self) -> usize {
        self.rank_len
    }

    /// The backend's chunk length for this layout.
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    /// The parameters' or the gradients' arena.
    pub fn arena(&self, values: Values) -> &Arena {
        match values {
            Values::Params => &self.params,
            Values::Grads => &self.grads,
        }
    }

    /// The parameters' or the gradients' arena, to write.
    pub(crate) fn arena_mut(&mut self, values: Values) -> &mut Arena {
        match values {
            Values::Params => &mut self.params,
            Values::Grads => &mut self.grads,
        }
    }

    /// An arena to write together with the parameter table (a kernel's arguments).
    pub(crate) fn arena_with_starts(&mut self, values: Values) -> (&mut Arena, &ParamStarts) {
        let arena = match values {
            Values::Params => &mut self.params,
            Values::Grads => &mut self.grads,
        };
        (arena, &self.starts)
    }

    /// The parameter arena to write, the gradient arena to read and the parameter table, at
    /// once (an optimizer's step).
    pub(crate) fn step_arenas(&mut self) -> (&mut Arena, &Arena, &ParamStarts) {
        (&mut self.params, &self.grads, &self.starts)
    }

    /// Both arenas to write and the parameter table, at once (DiLoCo's pseudo-gradient: from
    /// the parameters into the gradients).
    pub(crate) fn arenas_mut(&mut self) -> (&mut Arena, &mut Arena, &ParamStarts) {
        (&mut self.params, &mut self.grads, &self.starts)
    }

    /// The members' flags out of a per-parameter selection (`selected[j]` for global `j`).
    pub fn mask(&self, selected: &[bool]) -> Vec<bool> {
        self.members.iter().map(|&j| selected[j]).collect()
    }

    /// A zero-filled arena of this bucket's layout with `ranks` rows (optimizer state).
    ///
    /// # Errors
    /// As [`Backend::create_arena`]: a `RuntimeError` when the arena does not fit the memory budget
    /// or the GPU device refuses it.
    pub fn new_state_arena(&self, backend: &dyn Backend, ranks: usize) -> Result<Arena> {
        backend.create_arena(self.format, ranks, self.rank_len, self.chunk_len)
    }
}
