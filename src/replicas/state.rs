//! [`StateArenas`]: per-parameter state laid out like a [`Replicas`]' parameters (an
//! optimizer's momentum or moments, DiLoCo's copy of the parameters at the last sync), one
//! arena per format bucket, created when first needed.

use super::{Replicas, Values};
use crate::backend::Arena;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::transfer;

/// One arena per format bucket of a [`Replicas`], each created on first use, with the same
/// rows and layout as the bucket's parameters.
#[derive(Debug, Default)]
pub struct StateArenas {
    arenas: Vec<Option<Arena>>,
}

impl StateArenas {
    /// No arena yet, for replicas of `buckets` format buckets.
    pub fn empty(buckets: usize) -> StateArenas {
        StateArenas {
            arenas: (0..buckets).map(|_| None).collect(),
        }
    }

    /// A copy of the replicas' current parameters, every bucket.
    ///
    /// # Errors
    /// A `RuntimeError` when an arena does not fit the memory budget, or for a GPU error or a lost
    /// device.
    pub fn copy_of_params(replicas: &Replicas) -> Result<StateArenas> {
        let mut state = StateArenas::empty(replicas.buckets().len());
        for b in 0..replicas.buckets().len() {
            state.ensure(replicas, b)?;
        }
        let all: Vec<usize> = (0..replicas.len()).collect();
        state.copy_params(replicas, &all)?;
        Ok(state)
    }

    /// Bucket `bucket`'s arena, if created.
    pub fn get(&self, bucket: usize) -> Option<&Arena> {
        self.arenas.get(bucket).and_then(Option::as_ref)
    }

    /// Bucket `bucket`'s arena to write, if created.
    pub fn get_mut(&mut self, bucket: usize) -> Option<&mut Arena> {
        self.arenas.get_mut(bucket).and_then(Option::as_mut)
    }

    /// Whether parameter `j`'s bucket has its arena.
    pub fn holds(&self, replicas: &Replicas, j: usize) -> bool {
        self.get(replicas.place(j).bucket).is_some()
    }

    /// Bucket `bucket`'s arena, created zero-filled if it was not.
    ///
    /// # Errors
    /// When the arena is created: a `RuntimeError` when it does not fit the memory budget or the
    /// GPU device refuses it.
    pub fn ensure(&mut self, replicas: &Replicas, bucket: usize) -> Result<&mut Arena> {
        let slot = &mut self.arenas[bucket];
        if slot.is_none() {
            let layout = &replicas.buckets()[bucket];
            *slot = Some(layout.new_state_arena(replicas.backend().as_ref(), replicas.ranks())?);
        }
        Ok(slot.as_mut().expect("created above"))
    }

    /// Rank `rank`'s state of parameter `j`, read back as a tensor of the parameter's shape
    /// and dtype; `None` while its bucket has no arena.
    ///
    /// # Errors
    /// A `ValueError` when `rank` is out of range (not an `IndexError`, unlike
    /// [`Replicas::param`]); a `RuntimeError` when a GPU readback fails.
    pub async fn read(&self, replicas: &Replicas, rank: usize, j: usize) -> Result<Option<Tensor>> {
        let place = replicas.place(j);
        let Some(arena) = self.get(place.bucket) else {
            return Ok(None);
        };
        transfer::read_tensor(
            arena,
            rank,
            place.offset,
            replicas.shape(j),
            replicas.dtype(j),
        )
        .await
        .map(Some)
    }

    /// Writes encoded words (see [`transfer::encode_state`]) into rank `rank`'s state of
    /// parameter `j`, creating the bucket's arena if needed.
    pub(crate) fn write_words(
        &mut self,
        replicas: &Replicas,
        rank: usize,
        j: usize,
        words: &[u32],
    ) -> Result<()> {
        let place = replicas.place(j);
        self.ensure(replicas, place.bucket)?
            .write(rank, place.offset, words)
    }

    /// Copies every rank's current parameters `params` into this state (created buckets only).
    ///
    /// # Errors
    /// A `ValueError` when this state's arenas do not fit `replicas` (fewer rows or another format:
    /// state made for other replicas); a `RuntimeError` for a GPU error or a lost device.
    pub fn copy_params(&mut self, replicas: &Replicas, params: &[usize]) -> Result<()> {
        let backend = replicas.backend().clone();
        for (b, bucket) in replicas.buckets().iter().enumerate() {
            let Some(arena) = self.get_mut(b) else {
                continue;
            };
            let in_bucket: Vec<usize> = params
                .iter()
                .copied()
                .filter(|&j| replicas.place(j).bucket == b)
                .collect();
            let regions = replicas.same_place_regions(&in_bucket);
            if !regions.is_empty() {
                backend.copy_regions(bucket.arena(Values::Params), arena, &regions)?;
            }
        }
        Ok(())
    }

    /// Heals world rank `joiner`'s rows of every arena `source`'s process has created from
    /// world rank `source`'s over `world` ([`Communicator::heal_rows`]); the joiner creates
    /// those it lacks first (a rank that never synced has none of the lazily made ones).
    ///
    /// # Errors
    /// A `RuntimeError` when the source's arenas do not match these buckets; those of
    /// [`Communicator::heal_rows`] and of [`StateArenas::ensure`].
    pub fn heal(
        &mut self,
        world: &dyn Communicator,
        replicas: &Replicas,
        source: usize,
        joiner: usize,
    ) -> Result<()> {
        let held: Vec<u8> = self.arenas.iter().map(|a| u8::from(a.is_some())).collect();
        let held = world.heal_bytes(source, joiner, held)?;
        if held.len() != self.arenas.len() {
            return Err(Error::runtime(format!(
                "rank {source} heals rank {joiner} with state of {} buckets, this model has {}",
                held.len(),
                self.arenas.len()
            )));
        }
        let backend = replicas.backend().clone();
        for (b, _) in held.iter().enumerate().filter(|&(_, &h)| h != 0) {
            let arena = self.ensure(replicas, b)?;
            world.heal_rows(backend.as_ref(), arena, source, joiner)?;
        }
        Ok(())
    }

    /// Bytes of one rank's rows over every created arena.
    pub fn bytes_per_rank(&self) -> usize {
        self.arenas
            .iter()
            .flatten()
            .map(|a| a.bytes() / a.ranks().max(1))
            .sum()
    }
}
