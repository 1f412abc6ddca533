//! The communication layer: a world of ranks, contiguous subgroups, and collectives over
//! replica arenas, with the bytes a real implementation would move recorded per group level.
//!
//! A [`Communicator`] serves the ranks this process holds (its *local ranks*): every rank of the
//! world in the [`SimulatedWorld`] (all on one device), one rank per process in `MpiWorld`
//! (feature `mpi`). Arenas passed to a communicator hold the local ranks, in order; every rank
//! argument is a world rank. Algorithms written against the trait run unchanged on both.

mod collectives;
mod in_flight;
mod membership;
#[cfg(all(feature = "mpi", not(target_arch = "wasm32")))]
pub mod mpi;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
mod one_rank;
#[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
mod param_runs;
#[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
mod regions;
#[cfg(any(all(feature = "mpi", not(target_arch = "wasm32")), feature = "nats"))]
mod scratch;
mod simulated;
mod stats;
mod subgroups;
pub mod wire;

use std::ops::Range;

use crate::backend::{Arena, Backend};
use crate::error::{Error, Result};

pub use crate::backend::kernels::MeanOrder;
pub use collectives::{AllReduceMeanArgs, AllReduceScaledSumArgs};
pub use in_flight::{InFlightMean, InFlightMembership};
pub use membership::{Membership, MembershipSchedule};
#[cfg(all(feature = "mpi", not(target_arch = "wasm32")))]
pub use mpi::MpiWorld;
#[cfg(feature = "nats")]
pub use nats::{
    NatsOptions, NatsWorld, RunCredentials, RunPermissions, ServerListen, run_permissions,
    server_config,
};
pub use simulated::SimulatedWorld;
pub use stats::CommStats;
pub(crate) use stats::StatsCounter;
pub use subgroups::{Subgroups, new_subgroups};

/// One element range that a broadcast writes into every receiving rank (see
/// [`Communicator::broadcast_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BroadcastRegion {
    /// The rank of the source arena the elements come from (an index into that arena).
    pub src_rank: usize,
    /// First source element (word aligned).
    pub src_offset: usize,
    /// First destination element (word aligned), the same on every receiving rank.
    pub dst_offset: usize,
    /// Elements.
    pub len: usize,
}

/// Collectives over replica arenas. The simulated world runs them as kernels over the rank
/// axis of an arena; a one-rank-per-process implementation runs them over its transport.
///
/// Every rank of the world must make the same calls in the same order (as with any
/// collective library); arguments that describe the data (groups, parameters, regions) must
/// agree across ranks.
pub trait Communicator: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// Ranks in the world.
    fn world_size(&self) -> usize;

    /// The world ranks this process holds, in arena order: the whole world when simulated,
    /// one rank per process over MPI.
    fn local_ranks(&self) -> Range<usize> {
        0..self.world_size()
    }

    /// All-reduce-mean within every group of `mean.groups`, over the parameters flagged `active`:
    /// each value divided by the group size, then summed, or summed, then the sum divided, as
    /// `mean.order` says (in the `arith` precision). `arena` holds the local ranks.
    ///
    /// # Errors
    /// A `ValueError` when `arena` does not hold this process's ranks, `groups` partitions another
    /// world size, or `active` does not hold one flag per parameter; the backend's errors (a
    /// `ValueError` for mismatched arenas or tables, a `RuntimeError` for a GPU error or a lost
    /// device). Over MPI, an `arith` of float16 or bfloat16 for parameters of another format is a
    /// `ValueError`, and a failed subgroup split a `RuntimeError`.
    fn all_reduce_mean(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()>;

    /// The membership of the next sync point of an elastic algorithm (see
    /// [`Membership`]): every rank calls it once per sync point, at the same points, and gets the
    /// same answer. A world whose membership never changes (the default) answers the whole
    /// world, epoch 0, every time.
    ///
    /// # Errors
    /// A networked world's failure to agree (a `RuntimeError` naming what failed).
    fn membership(&self) -> Result<Membership> {
        Ok(Membership::full(self.world_size(), 0))
    }

    /// [`Communicator::all_reduce_mean`] over the `live` ranks only (one flag per world rank,
    /// as [`Membership::live`]): within every group of `mean.groups`, the mean of the live
    /// ranks' values (each divided by the number of the group's live ranks and summed in rank
    /// order, or summed and divided, as `mean.order` says), written to the live ranks, exactly
    /// as a world of only those ranks computes it; the other ranks keep their data. With every
    /// rank live it is `all_reduce_mean`.
    ///
    /// # Errors
    /// Those of `all_reduce_mean`; a `ValueError` when `live` does not hold one flag per world
    /// rank or no rank is live; a `RuntimeError` when a rank is not live and this world cannot
    /// leave ranks out (the default, which MPI uses: its communicator is fixed).
    fn all_reduce_mean_live(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        live: &[bool],
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        check_live(live, self.world_size())?;
        if let Some(rank) = live.iter().position(|&l| !l) {
            return Err(Error::runtime(format!(
                "rank {rank} is not live, and this world's membership is fixed: every rank takes part in every collective"
            )));
        }
        self.all_reduce_mean(backend, arena, mean)
    }

    /// Starts agreeing on the membership of the next sync point (as
    /// [`Communicator::membership`]) so that the agreement, and the means started over it
    /// ([`Communicator::start_all_reduce_mean_in`]), travel while the caller computes
    /// (Streaming DiLoCo's fragment during its `fragment_sync_delay`). Every rank starts and
    /// finishes at the same points. The default agrees now.
    ///
    /// # Errors
    /// Those of `membership` that can be known at the start.
    fn start_membership(&self) -> Result<InFlightMembership> {
        Ok(InFlightMembership::done(self.membership()?))
    }

    /// Moves a membership [`Communicator::start_membership`] started on as far as it goes
    /// without waiting, for a world that has no thread to agree on (a wasm rank over NATS):
    /// the caller calls it between its steps while the membership is in flight. The default
    /// does nothing.
    fn progress_membership(&self, membership: &InFlightMembership) {
        let _ = membership;
    }

    /// The membership [`Communicator::start_membership`] started agreeing on, once agreed.
    ///
    /// # Errors
    /// Those of [`Communicator::membership`]; a `RuntimeError` for a membership another world
    /// started.
    fn finish_membership(&self, membership: InFlightMembership) -> Result<Membership> {
        membership.into_inner().map_err(|_| {
            Error::runtime(
                "a membership in flight was started by another world than the one finishing it",
            )
        })
    }

    /// Starts [`Communicator::all_reduce_mean_live`] over the live ranks of `membership` (in
    /// flight or agreed) so that it travels while the caller computes: the arena's values are
    /// taken now, and [`Communicator::finish_all_reduce_mean_live`] later writes the mean into
    /// the same arena, which the caller leaves as it is in between (a rank outside the
    /// membership keeps its data). Other collectives may run in between. The result, and its
    /// rule when a rank dies meanwhile (the mean applied on every live rank or on none), are
    /// those of `all_reduce_mean_live`. The default computes the mean now, into the arena; a
    /// world of processes moves it in the background.
    ///
    /// # Errors
    /// Those of `all_reduce_mean_live` that can be known at the start; a `RuntimeError` for a
    /// membership in flight of another world.
    fn start_all_reduce_mean_in(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        membership: &InFlightMembership,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<InFlightMean> {
        let agreed = membership.agreed().ok_or_else(|| {
            Error::runtime("a membership in flight was started by another world than this one")
        })?;
        self.all_reduce_mean_live(backend, arena, &agreed.live, mean)?;
        Ok(InFlightMean::done())
    }

    /// Waits for a mean [`Communicator::start_all_reduce_mean_in`] started and writes it into
    /// `arena`, the arena it started on, untouched since. A mean already done is left as it is.
    ///
    /// # Errors
    /// Those of `all_reduce_mean_live`; a `RuntimeError` for a mean another world started.
    fn finish_all_reduce_mean_live(
        &self,
        _backend: &dyn Backend,
        _arena: &mut Arena,
        in_flight: InFlightMean,
    ) -> Result<()> {
        if in_flight.is_done() {
            return Ok(());
        }
        Err(Error::runtime(
            "an all-reduce-mean in flight was started by another world than the one finishing it",
        ))
    }

    /// `DistributedDataParallel`'s gradient all-reduce, joined ranks included (see
    /// [`Backend::scaled_sum`]): a local rank with a scale contributes its values of the
    /// `reduced` parameters times the scale (zeros where not `present`, which is
    /// `present[i * params + j]` for local rank i), a rank with `None` (a joined rank shadowing
    /// the collective) contributes zeros and keeps its data, and the sum over the world is
    /// written to the ranks with a scale. `reduced` must agree on every rank.
    ///
    /// # Errors
    /// A `ValueError` when `arena` does not hold this process's ranks, or `reduced`, `scales` and
    /// `present` do not fit the parameters and local ranks (as in [`Backend::scaled_sum`]); the
    /// backend's errors (a `ValueError` for mismatched arenas or tables, a `RuntimeError` for a GPU
    /// error or a lost device). Over MPI, an `arith` of float16 or bfloat16 for values of another
    /// format is a `ValueError`.
    fn all_reduce_scaled_sum(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        sum: AllReduceScaledSumArgs<'_>,
    ) -> Result<()>;

    /// Copies elements `offset..offset+len` of world rank `root` to every other rank.
    ///
    /// # Errors
    /// A `ValueError` when `root` is outside the world (the simulated world checks it against the
    /// arena's ranks) or `offset + len` exceeds a rank's elements (over MPI also when `arena` holds
    /// more than the process's one rank); the backend's errors (a `ValueError` for mismatched
    /// arenas or tables, a `RuntimeError` for a GPU error or a lost device).
    fn broadcast(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Broadcasts world rank `root`'s data into every other rank's `dst` as the listed
    /// regions. `src` (for example a flat bucket) holds the data in the process that holds
    /// `root` and is `None` elsewhere.
    ///
    /// # Errors
    /// A `RuntimeError` when the process holding `root` passes no `src`; a `ValueError` when `src`
    /// and `dst` differ in format or a region lies outside them (over MPI also when `root` is
    /// outside the world or `dst` holds more than the process's one rank); the backend's errors (a
    /// `ValueError` for mismatched arenas or tables, a `RuntimeError` for a GPU error or a lost
    /// device).
    fn broadcast_regions(
        &self,
        backend: &dyn Backend,
        src: Option<&Arena>,
        dst: &mut Arena,
        root: usize,
        regions: &[BroadcastRegion],
    ) -> Result<()>;

    /// Heals rank `joiner` from rank `source` in `arena` (a rank that joins, at the end of the
    /// sync point that admitted it): `joiner`'s row becomes `source`'s. Where this process holds
    /// both, a copy on the device; in a world of processes the holder of `source` sends its row
    /// and the holder of `joiner` receives it, every other process doing nothing. Every
    /// process of the world makes the same heal calls in the same order.
    ///
    /// # Errors
    /// A `RuntimeError` when this world cannot heal across processes and one of the two ranks is
    /// another process's (`heal_indices`); the backend's and the transport's errors.
    fn heal_rows(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        source: usize,
        joiner: usize,
    ) -> Result<()> {
        let (to, from) = both_local(self.local_ranks(), joiner, source)?;
        let len = arena.rank_len();
        backend.copy_between_ranks(arena, from, to, 0, len)
    }

    /// A heal's host-side state (counters, flags): `data` as the holder of `source` passes it,
    /// returned where `joiner` is held (and to `source`'s holder); another process gets its
    /// own `data` back. Called as [`Communicator::heal_rows`] is.
    ///
    /// # Errors
    /// Those of [`Communicator::heal_rows`].
    fn heal_bytes(&self, source: usize, joiner: usize, data: Vec<u8>) -> Result<Vec<u8>> {
        both_local(self.local_ranks(), joiner, source)?;
        Ok(data)
    }

    /// The elementwise float32 sum over the world of every rank's `values` (host data; one
    /// vector per local rank, all of one length), on every rank: in rank order when this
    /// process holds every rank, in the transport's order otherwise.
    ///
    /// # Errors
    /// A `ValueError` when `per_local_rank` does not hold one vector per local rank (in the
    /// simulated world also when the vectors differ in length).
    fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> Result<Vec<f32>>;

    /// World rank `root`'s bytes on every rank. `data` is given by the process holding `root`
    /// and `None` elsewhere.
    ///
    /// # Errors
    /// A `ValueError` when `root` is outside the world, or when the process holding `root` passes
    /// no `data`.
    fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>>;

    /// Every rank's bytes (serialized objects), in world rank order, on every rank.
    /// `per_local_rank` has one entry per local rank.
    ///
    /// # Errors
    /// A `ValueError` when `per_local_rank` does not hold one entry per local rank (over MPI also
    /// for more than 2 GiB of objects, one or all together).
    fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>>;

    /// [`Communicator::all_gather_bytes`] for reports of an elastic run: the bytes of every rank
    /// still present, `None` for a rank that left (outside the last agreed membership, or
    /// silent for the world's failure bound while awaited) instead of failing the gather. Never
    /// for training data: which ranks are present is this process's own view, not an agreement
    /// (that is [`Communicator::membership`]). The default, for worlds whose ranks cannot leave,
    /// is `all_gather_bytes` with every rank present.
    ///
    /// # Errors
    /// Those of `all_gather_bytes`, except a rank that left.
    fn all_gather_bytes_present(
        &self,
        per_local_rank: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(self
            .all_gather_bytes(per_local_rank)?
            .into_iter()
            .map(Some)
            .collect())
    }

    /// Every rank's bytes, in world rank order, on the process that holds world rank `to`
    /// (`None` elsewhere): `torch.distributed.gather_object`.
    ///
    /// # Errors
    /// A `ValueError` when `to` is outside the world or `per_local_rank` does not hold one entry
    /// per local rank (over MPI also for more than 2 GiB of objects, one or all together).
    fn gather_bytes(&self, to: usize, per_local_rank: Vec<Vec<u8>>)
    -> Result<Option<Vec<Vec<u8>>>>;

    /// The bytes recorded so far.
    fn stats(&self) -> CommStats;

    /// Clears the counters.
    fn reset_stats(&self);
}

/// Checks a live mask: one flag per rank of a world of `world_size`, at least one set.
///
/// # Errors
/// A `ValueError` naming what is wrong.
pub(crate) fn check_live(live: &[bool], world_size: usize) -> Result<()> {
    if live.len() != world_size {
        return Err(Error::value(format!(
            "{} live flags for a world of {world_size} ranks",
            live.len()
        )));
    }
    if !live.contains(&true) {
        return Err(Error::value("no rank is live"));
    }
    Ok(())
}

/// A `ValueError` unless `root` is a rank of a world of `size` (`what`: the collective, in the
/// message).
fn check_root(root: usize, size: usize, what: &str) -> Result<()> {
    if root >= size {
        return Err(Error::value(format!(
            "{what} from rank {root} in a world of {size}"
        )));
    }
    Ok(())
}

/// A `ValueError` unless `to`, the rank a gather collects on, is a rank of a world of `size`.
fn check_gather_root(to: usize, size: usize) -> Result<()> {
    if to >= size {
        return Err(Error::value(format!(
            "gather to rank {to} in a world of {size}"
        )));
    }
    Ok(())
}

/// The data the root of a [`Communicator::broadcast_bytes`] from `root` passed; a `ValueError`
/// when it passed none.
fn root_data(root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
    data.ok_or_else(|| Error::value(format!("broadcast from rank {root}: its data is missing")))
}

/// The local indices `(to, from)` of a heal of world rank `joiner` from world rank `source`.
///
/// # Errors
/// A `RuntimeError` when either rank is held by another process (healing across processes is
/// a state transfer this function does not make).
pub fn heal_indices(
    world: &dyn Communicator,
    joiner: usize,
    source: usize,
) -> Result<(usize, usize)> {
    both_local(world.local_ranks(), joiner, source)
}

/// The local indices `(to, from)` of `joiner` and `source` among the `local` ranks, both held.
fn both_local(local: Range<usize>, joiner: usize, source: usize) -> Result<(usize, usize)> {
    if local.contains(&joiner) && local.contains(&source) {
        return Ok((joiner - local.start, source - local.start));
    }
    Err(Error::runtime(format!(
        "rank {joiner} joins the run, but this process cannot heal it from rank {source}: one of them is held by another process"
    )))
}

/// The index of world rank `rank` in this process's arenas, if it holds that rank.
pub fn local_index(world: &dyn Communicator, rank: usize) -> Option<usize> {
    let local = world.local_ranks();
    local.contains(&rank).then(|| rank - local.start)
}

/// For every entry, whether it is true on any rank of the world. `per_local_rank[i]` are local
/// rank i's flags; every rank passes the same number of them.
///
/// # Errors
/// When this process holds part of the world only: those of [`Communicator::all_gather_bytes`], and
/// a `RuntimeError` when the ranks pass different numbers of flags. A process holding the whole
/// world never fails.
pub fn any_rank(world: &dyn Communicator, per_local_rank: &[Vec<bool>]) -> Result<Vec<bool>> {
    let len = per_local_rank.first().map_or(0, Vec::len);
    if world.local_ranks().len() == world.world_size() {
        // This process holds every rank: nothing to exchange.
        let mut any = vec![false; len];
        for flags in per_local_rank {
            for (a, &f) in any.iter_mut().zip(flags) {
                *a |= f;
            }
        }
        return Ok(any);
    }
    let bytes = per_local_rank
        .iter()
        .map(|flags| flags.iter().map(|&f| u8::from(f)).collect())
        .collect();
    let all = world.all_gather_bytes(bytes)?;
    let mut any = vec![false; len];
    for flags in &all {
        if flags.len() != len {
            return Err(Error::runtime(format!(
                "ranks disagree on the number of flags: {} and {len}",
                flags.len()
            )));
        }
        for (a, &f) in any.iter_mut().zip(flags) {
            *a |= f != 0;
        }
    }
    Ok(any)
}

/// Every rank's `f64` values, in world rank order, on every rank (host data such as losses or
/// a small model's parameters).
///
/// # Errors
/// When this process holds part of the world only, those of [`Communicator::all_gather_bytes`]. A
/// process holding the whole world never fails.
pub fn all_gather_f64(
    world: &dyn Communicator,
    per_local_rank: &[Vec<f64>],
) -> Result<Vec<Vec<f64>>> {
    if world.local_ranks().len() == world.world_size() {
        return Ok(per_local_rank.to_vec());
    }
    Ok(world
        .all_gather_bytes(f64_bytes(per_local_rank))?
        .iter()
        .map(|b| bytes_f64(b))
        .collect())
}

/// [`all_gather_f64`] through [`Communicator::all_gather_bytes_present`]: `None` for a rank
/// that left (reports of an elastic run).
///
/// # Errors
/// When this process holds part of the world only, those of
/// [`Communicator::all_gather_bytes_present`]. A process holding the whole world never fails.
pub fn all_gather_f64_present(
    world: &dyn Communicator,
    per_local_rank: &[Vec<f64>],
) -> Result<Vec<Option<Vec<f64>>>> {
    if world.local_ranks().len() == world.world_size() {
        return Ok(per_local_rank.iter().cloned().map(Some).collect());
    }
    Ok(world
        .all_gather_bytes_present(f64_bytes(per_local_rank))?
        .iter()
        .map(|b| b.as_deref().map(bytes_f64))
        .collect())
}

fn f64_bytes(per_local_rank: &[Vec<f64>]) -> Vec<Vec<u8>> {
    per_local_rank
        .iter()
        .map(|values| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect()
}

fn bytes_f64(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect()
}
