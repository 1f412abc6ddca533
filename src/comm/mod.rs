//! The communication layer: a world of ranks, contiguous subgroups, and collectives over
//! replica arenas, with the bytes a real implementation would move recorded per group level.
//!
//! Today every rank lives in this process on one device ([`SimulatedWorld`]); the
//! [`Communicator`] trait is what a one-rank-per-process implementation provides instead.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::backend::kernels::ParamStarts;
use crate::backend::{Arena, Backend, CopyRegion};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

/// A partition of the world into contiguous groups `[k*g, (k+1)*g)`, as
/// `torch.distributed.new_subgroups(group_size=g)` makes them. `g == world_size` is the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subgroups {
    world_size: usize,
    group_size: usize,
}

impl Subgroups {
    /// The whole world as one group.
    pub fn world(world_size: usize) -> Subgroups {
        Subgroups {
            world_size,
            group_size: world_size,
        }
    }

    /// Ranks per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The ranks of the group that `rank` belongs to.
    pub fn group_of(&self, rank: usize) -> std::ops::Range<usize> {
        let first = rank / self.group_size * self.group_size;
        first..first + self.group_size
    }
}

/// `torch.distributed.new_subgroups(group_size)`: contiguous groups of `group_size` ranks, with
/// PyTorch's validation errors.
///
/// ```
/// use distopt::comm::new_subgroups;
/// assert_eq!(new_subgroups(4, 2).unwrap().group_of(3), 2..4);
/// let err = new_subgroups(4, 3).unwrap_err();
/// assert_eq!(err.message(), "The world size (4) must be divisible by 'group_size=3'");
/// ```
pub fn new_subgroups(world_size: usize, group_size: i64) -> Result<Subgroups> {
    if group_size <= 0 {
        return Err(Error::value(format!(
            "The arg 'group_size' ({group_size}) must be positive"
        )));
    }
    if group_size as u64 > world_size as u64 {
        return Err(Error::value(format!(
            "The arg 'group_size' ({group_size}) must not exceed the world size ({world_size})"
        )));
    }
    let group_size = group_size as usize;
    if !world_size.is_multiple_of(group_size) {
        return Err(Error::value(format!(
            "The world size ({world_size}) must be divisible by 'group_size={group_size}'"
        )));
    }
    Ok(Subgroups {
        world_size,
        group_size,
    })
}

/// Bytes that collectives would have moved over a network, per rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommStats {
    /// All-reduce bytes sent per rank, by group size (a ring all-reduce of B bytes over g ranks
    /// sends `2·(g−1)/g·B` per rank).
    pub all_reduce_bytes_by_group_size: BTreeMap<usize, u64>,
    /// Broadcast bytes received per non-root rank.
    pub broadcast_bytes: u64,
    /// Gather bytes received by the destination rank.
    pub gather_bytes: u64,
    /// Number of collective calls.
    pub collectives: u64,
}

impl CommStats {
    /// All bytes per rank, every kind of collective.
    pub fn total_bytes(&self) -> u64 {
        self.all_reduce_bytes_by_group_size.values().sum::<u64>()
            + self.broadcast_bytes
            + self.gather_bytes
    }
}

/// Collectives over replica arenas. The simulated world runs them as kernels over the rank
/// axis of an arena; a one-rank-per-process implementation runs them over its transport.
pub trait Communicator: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// Ranks in the world.
    fn world_size(&self) -> usize;

    /// All-reduce-mean within every group of `groups`, over the parameters flagged `active`:
    /// each value divided by the group size, then summed (in the `arith` precision).
    #[allow(clippy::too_many_arguments)]
    fn all_reduce_mean(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        groups: Subgroups,
        arith: StorageFormat,
        starts: &ParamStarts,
        active: &[bool],
        bytes_per_rank: u64,
    ) -> Result<()>;

    /// Copies elements `offset..offset+len` of rank `root` to every other rank.
    fn broadcast(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Broadcasts rank `root`'s data, held in `src` (for example a flat bucket), into `dst` as
    /// the listed regions (one per destination rank and tensor).
    fn broadcast_regions(
        &self,
        backend: &dyn Backend,
        src: &Arena,
        dst: &mut Arena,
        root: usize,
        regions: &[CopyRegion],
    ) -> Result<()>;

    /// Gathers `bytes` of serialized objects (state dicts) to one rank.
    fn gather_object_bytes(&self, bytes: u64);

    /// The bytes recorded so far.
    fn stats(&self) -> CommStats;

    /// Clears the counters.
    fn reset_stats(&self);
}

/// Every rank in this process, on one device: collectives are kernels over the rank axis.
#[derive(Debug)]
pub struct SimulatedWorld {
    size: usize,
    stats: Mutex<CommStats>,
}

impl SimulatedWorld {
    /// A world of `size` ranks (at least one).
    pub fn new(size: usize) -> Result<SimulatedWorld> {
        if size == 0 {
            return Err(Error::value("a world needs at least one rank"));
        }
        Ok(SimulatedWorld {
            size,
            stats: Mutex::new(CommStats::default()),
        })
    }

    fn record(&self, update: impl FnOnce(&mut CommStats)) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.collectives += 1;
        update(&mut stats);
    }
}

impl Communicator for SimulatedWorld {
    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce_mean(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        groups: Subgroups,
        arith: StorageFormat,
        starts: &ParamStarts,
        active: &[bool],
        bytes_per_rank: u64,
    ) -> Result<()> {
        if groups.world_size() != self.size || arena.ranks() != self.size {
            return Err(Error::value(format!(
                "all_reduce over {} ranks in a world of {}",
                arena.ranks(),
                self.size
            )));
        }
        backend.average(arena, groups.group_size(), arith, starts, active)?;
        let g = groups.group_size() as u64;
        self.record(|s| {
            *s.all_reduce_bytes_by_group_size
                .entry(groups.group_size())
                .or_default() += 2 * (g - 1) * bytes_per_rank / g;
        });
        Ok(())
    }

    fn broadcast(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        if root >= arena.ranks() {
            return Err(Error::value(format!(
                "broadcast from rank {root} in a world of {}",
                arena.ranks()
            )));
        }
        for rank in 0..arena.ranks() {
            if rank != root {
                backend.copy_between_ranks(arena, root, rank, offset, len)?;
            }
        }
        let bytes = (len * arena.format().element_bytes()) as u64;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(())
    }

    fn broadcast_regions(
        &self,
        backend: &dyn Backend,
        src: &Arena,
        dst: &mut Arena,
        root: usize,
        regions: &[CopyRegion],
    ) -> Result<()> {
        backend.copy_regions(src, dst, regions)?;
        // Bytes one receiving rank gets: the regions addressed to any one non-root rank.
        let receiver = regions.iter().map(|r| r.dst_rank).find(|&d| d != root);
        let bytes: usize = regions
            .iter()
            .filter(|r| Some(r.dst_rank) == receiver)
            .map(|r| r.len * src.format().element_bytes())
            .sum();
        self.record(|s| s.broadcast_bytes += bytes as u64);
        Ok(())
    }

    fn gather_object_bytes(&self, bytes: u64) {
        self.record(|s| s.gather_bytes += bytes);
    }

    fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reset_stats(&self) {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = CommStats::default();
    }
}
