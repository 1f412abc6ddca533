//! [`CommStats`]: the bytes a real implementation of the collectives would move, per rank and
//! group size, and the counter each world keeps of them.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Bytes that collectives would have moved over a network, per rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommStats {
    /// All-reduce bytes sent per rank, by group size (a ring all-reduce of B bytes over g ranks
    /// sends `2·(g−1)/g·B` per rank).
    pub all_reduce_bytes_by_group_size: BTreeMap<usize, u64>,
    /// Broadcast bytes received per non-root rank.
    pub broadcast_bytes: u64,
    /// Gather bytes received by the destination rank (all-gathers: by every rank).
    pub gather_bytes: u64,
    /// Number of collective calls.
    pub collectives: u64,
}

impl CommStats {
    /// Counts one ring all-reduce of `bytes_per_rank` bytes over groups of `group_size` ranks:
    /// each rank sends `2·(g−1)/g` of the tensor.
    pub fn add_all_reduce(&mut self, group_size: usize, bytes_per_rank: u64) {
        let g = group_size as u64;
        *self
            .all_reduce_bytes_by_group_size
            .entry(group_size)
            .or_default() += 2 * (g - 1) * bytes_per_rank / g;
    }

    /// What was recorded since `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        let mut by_size = self.all_reduce_bytes_by_group_size.clone();
        for (size, bytes) in &earlier.all_reduce_bytes_by_group_size {
            if let Some(b) = by_size.get_mut(size) {
                *b = b.saturating_sub(*bytes);
            }
        }
        by_size.retain(|_, b| *b > 0);
        CommStats {
            all_reduce_bytes_by_group_size: by_size,
            broadcast_bytes: self.broadcast_bytes.saturating_sub(earlier.broadcast_bytes),
            gather_bytes: self.gather_bytes.saturating_sub(earlier.gather_bytes),
            collectives: self.collectives.saturating_sub(earlier.collectives),
        }
    }

    /// All bytes per rank, every kind of collective.
    pub fn total_bytes(&self) -> u64 {
        self.all_reduce_bytes_by_group_size.values().sum::<u64>()
            + self.broadcast_bytes
            + self.gather_bytes
    }
}

/// A world's [`CommStats`], shared by its collectives (each counts itself once it succeeded).
#[derive(Debug, Default)]
pub(crate) struct StatsCounter(Mutex<CommStats>);

impl StatsCounter {
    /// Counts one collective, and what `update` adds to the byte counts.
    pub(crate) fn record(&self, update: impl FnOnce(&mut CommStats)) {
        let mut stats = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stats.collectives += 1;
        update(&mut stats);
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> CommStats {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Clears the counts.
    pub(crate) fn reset(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = CommStats::default();
    }
}

/// The bytes a gather of `parts` (every rank's, by rank) to rank `to` moves: all but `to`'s own.
pub(crate) fn gathered_to(parts: &[Vec<u8>], to: usize) -> u64 {
    let own = parts.get(to).map_or(0, Vec::len);
    (parts.iter().map(Vec::len).sum::<usize>() - own) as u64
}
