//! [`SimulatedWorld`]: every rank in this process, on one device; collectives are kernels over
//! the rank axis of an arena. With a [`MembershipSchedule`] it replays an elastic run: which
//! ranks take part in which sync point.

use std::sync::Mutex;

use super::stats::gathered_to;
use super::{
    AllReduceMeanArgs, AllReduceScaledSumArgs, BroadcastRegion, CommStats, Communicator,
    Membership, MembershipSchedule, StatsCounter,
};
use crate::backend::kernels::{AverageArgs, ScaledSumArgs};
use crate::backend::{Arena, Backend, CopyRegion, CpuBackend};
use crate::error::{Error, Result};

/// Every rank in this process, on one device: collectives are kernels over the rank axis.
#[derive(Debug)]
pub struct SimulatedWorld {
    size: usize,
    stats: StatsCounter,
    /// Who takes part in which sync point (`None`: everyone in every one).
    schedule: Option<MembershipSchedule>,
    /// Sync points so far (calls of [`Communicator::membership`]).
    syncs: Mutex<u64>,
}

impl SimulatedWorld {
    /// A world of `size` ranks (at least one).
    ///
    /// # Errors
    /// A `ValueError` when `size` is 0.
    pub fn new(size: usize) -> Result<SimulatedWorld> {
        if size == 0 {
            return Err(Error::value("a world needs at least one rank"));
        }
        Ok(SimulatedWorld {
            size,
            stats: StatsCounter::default(),
            schedule: None,
            syncs: Mutex::new(0),
        })
    }

    /// A world of `schedule.world_size()` ranks whose elastic algorithms replay `schedule`:
    /// sync point `k` (the `k`-th call of [`Communicator::membership`]) averages over
    /// `schedule.at(k)`'s live ranks, and heals the ranks that join after it.
    ///
    /// ```
    /// use distopt::comm::{Communicator, MembershipSchedule, SimulatedWorld};
    /// let schedule = MembershipSchedule::new(3, vec![vec![0, 1, 2], vec![0, 2]]).unwrap();
    /// let world = SimulatedWorld::with_schedule(schedule).unwrap();
    /// assert!(world.membership().unwrap().is_full());
    /// assert_eq!(world.membership().unwrap().live, vec![true, false, true]);
    /// ```
    ///
    /// # Errors
    /// A `ValueError` when the schedule is of a world of no rank.
    pub fn with_schedule(schedule: MembershipSchedule) -> Result<SimulatedWorld> {
        let mut world = SimulatedWorld::new(schedule.world_size())?;
        world.schedule = Some(schedule);
        Ok(world)
    }

    /// Sync points so far: calls of [`Communicator::membership`] (the next one's index).
    pub fn sync_points(&self) -> u64 {
        *self.syncs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The membership schedule this world replays, if any.
    pub fn schedule(&self) -> Option<&MembershipSchedule> {
        self.schedule.as_ref()
    }

    fn check_local(&self, count: usize) -> Result<()> {
        if count != self.size {
            return Err(Error::value(format!(
                "{count} ranks' data passed to a world that holds {} ranks",
                self.size
            )));
        }
        Ok(())
    }

    /// The checks of an all-reduce-mean in this world: `mean.groups` partitions it and `arena`
    /// holds every rank.
    fn check_mean(&self, arena: &Arena, mean: &AllReduceMeanArgs<'_>) -> Result<()> {
        if mean.groups.world_size() != self.size || arena.ranks() != self.size {
            return Err(Error::value(format!(
                "all_reduce over {} ranks in a world of {}",
                arena.ranks(),
                self.size
            )));
        }
        Ok(())
    }

    fn record(&self, update: impl FnOnce(&mut CommStats)) {
        self.stats.record(update);
    }
}

impl Communicator for SimulatedWorld {
    fn world_size(&self) -> usize {
        self.size
    }

    fn membership(&self) -> Result<Membership> {
        let mut syncs = self.syncs.lock().unwrap_or_else(|e| e.into_inner());
        let k = *syncs;
        *syncs += 1;
        Ok(match &self.schedule {
            Some(schedule) => schedule.at(k),
            None => Membership::full(self.size, k),
        })
    }

    fn all_reduce_mean_live(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        live: &[bool],
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        super::check_live(live, self.size)?;
        if live.iter().all(|&l| l) {
            return self.all_reduce_mean(backend, arena, mean);
        }
        self.check_mean(arena, &mean)?;
        // The groups' live ranks by their number: those with n live ranks are gathered, in rank
        // order, into an arena of groups of n, averaged there as a world of n-rank groups would
        // be, and copied back. Ranks that are not live keep their data.
        let mut by_count: Vec<(usize, Vec<usize>)> = Vec::new();
        for first in (0..self.size).step_by(mean.groups.group_size()) {
            let members: Vec<usize> = mean
                .groups
                .group_of(first)
                .filter(|&rank| live[rank])
                .collect();
            let n = members.len();
            if n == 0 {
                continue;
            }
            match by_count.iter_mut().find(|(count, _)| *count == n) {
                Some((_, ranks)) => ranks.extend(members),
                None => by_count.push((n, members)),
            }
        }
        let len = arena.rank_len();
        if len == 0 {
            // Nothing to average: the arguments are checked, nothing changes.
            return backend.average(AverageArgs {
                arena,
                group_size: mean.groups.group_size(),
                arith: mean.arith,
                starts: mean.starts,
                active: mean.active,
                order: mean.order,
            });
        }
        for (n, ranks) in by_count {
            // A host arena (float64 on a GPU backend) gathers into a host arena.
            let host;
            let maker: &dyn Backend = if arena.is_on_device() {
                backend
            } else {
                host = CpuBackend::with_threads(1);
                &host
            };
            let mut gathered =
                maker.create_scratch_arena(arena.format(), ranks.len(), len, arena.chunk_len())?;
            let there: Vec<CopyRegion> = ranks
                .iter()
                .enumerate()
                .map(|(i, &rank)| CopyRegion {
                    src_rank: rank,
                    src_offset: 0,
                    dst_rank: i,
                    dst_offset: 0,
                    len,
                })
                .collect();
            backend.copy_regions(arena, &mut gathered, &there)?;
            backend.average(AverageArgs {
                arena: &mut gathered,
                group_size: n,
                arith: mean.arith,
                starts: mean.starts,
                active: mean.active,
                order: mean.order,
            })?;
            let back: Vec<CopyRegion> = there
                .iter()
                .map(|r| CopyRegion {
                    src_rank: r.dst_rank,
                    dst_rank: r.src_rank,
                    ..*r
                })
                .collect();
            backend.copy_regions(&gathered, arena, &back)?;
            self.record(|s| s.add_all_reduce(n, mean.bytes_per_rank));
        }
        Ok(())
    }

    fn all_reduce_mean(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        self.check_mean(arena, &mean)?;
        backend.average(AverageArgs {
            arena,
            group_size: mean.groups.group_size(),
            arith: mean.arith,
            starts: mean.starts,
            active: mean.active,
            order: mean.order,
        })?;
        self.record(|s| s.add_all_reduce(mean.groups.group_size(), mean.bytes_per_rank));
        Ok(())
    }

    fn all_reduce_scaled_sum(
        &self,
        backend: &dyn Backend,
        arena: &mut Arena,
        sum: AllReduceScaledSumArgs<'_>,
    ) -> Result<()> {
        self.check_local(arena.ranks())?;
        backend.scaled_sum(ScaledSumArgs {
            arena,
            arith: sum.arith,
            starts: sum.starts,
            reduced: sum.reduced,
            scales: sum.scales,
            present: sum.present,
        })?;
        self.record(|s| s.add_all_reduce(self.size, sum.bytes_per_rank));
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
        super::check_root(root, arena.ranks(), "broadcast")?;
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
        src: Option<&Arena>,
        dst: &mut Arena,
        root: usize,
        regions: &[BroadcastRegion],
    ) -> Result<()> {
        let src = src.ok_or_else(|| {
            Error::runtime(format!(
                "broadcast from rank {root}: the simulated world holds every rank, so it needs the source"
            ))
        })?;
        let copies: Vec<CopyRegion> = (0..dst.ranks())
            .filter(|&rank| rank != root)
            .flat_map(|rank| {
                regions.iter().map(move |r| CopyRegion {
                    src_rank: r.src_rank,
                    src_offset: r.src_offset,
                    dst_rank: rank,
                    dst_offset: r.dst_offset,
                    len: r.len,
                })
            })
            .collect();
        backend.copy_regions(src, dst, &copies)?;
        // Bytes one receiving rank gets.
        let bytes: usize = regions
            .iter()
            .map(|r| r.len * src.format().element_bytes())
            .sum();
        self.record(|s| s.broadcast_bytes += bytes as u64);
        Ok(())
    }

    fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> Result<Vec<f32>> {
        self.check_local(per_local_rank.len())?;
        let len = per_local_rank[0].len();
        if let Some(rank) = per_local_rank.iter().position(|v| v.len() != len) {
            return Err(Error::value(format!(
                "rank {rank} passed {} values to a sum of {len}",
                per_local_rank[rank].len()
            )));
        }
        let mut sum = vec![0f32; len];
        for values in per_local_rank {
            for (s, &v) in sum.iter_mut().zip(values) {
                *s += v;
            }
        }
        let bytes = (len * 4) as u64;
        self.record(|s| s.add_all_reduce(self.size, bytes));
        Ok(sum)
    }

    fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
        super::check_root(root, self.size, "broadcast")?;
        let data = super::root_data(root, data)?;
        let bytes = data.len() as u64;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(data)
    }

    fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        self.check_local(per_local_rank.len())?;
        let bytes: usize = per_local_rank.iter().map(Vec::len).sum();
        self.record(|s| s.gather_bytes += bytes as u64);
        Ok(per_local_rank)
    }

    fn gather_bytes(
        &self,
        to: usize,
        per_local_rank: Vec<Vec<u8>>,
    ) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_local(per_local_rank.len())?;
        super::check_gather_root(to, self.size)?;
        let bytes = gathered_to(&per_local_rank, to);
        self.record(|s| s.gather_bytes += bytes);
        Ok(Some(per_local_rank))
    }

    fn stats(&self) -> CommStats {
        self.stats.snapshot()
    }

    fn reset_stats(&self) {
        self.stats.reset();
    }
}
