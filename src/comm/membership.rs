//! Who takes part in a sync: a run's [`Membership`] per sync point (its epoch), and the
//! [`MembershipSchedule`] the simulated world replays, so that an elastic run (ranks leaving
//! and joining) can be studied and tested without a network.
//!
//! Membership changes only at the sync points of the elastic algorithms (each all-reduce of
//! DiLoCo's pseudo-gradients, each averaging of post-local SGD and the averagers): at sync
//! point `k` the *live* ranks contribute and receive the mean over the live ranks only; a
//! rank that enters at the next point is *healed* at the end of point `k`: it receives the
//! state of the lowest live rank (parameters, optimizer states, counters) and contributes from
//! point `k + 1` on.

use crate::error::{Error, Result};

/// The membership of one sync point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The sync point's index in the run (0, 1, …): the membership epoch.
    pub epoch: u64,
    /// For every world rank, whether it takes part in this sync.
    pub live: Vec<bool>,
    /// The ranks that enter after this sync, in rank order: each is healed from
    /// [`Membership::source`] at its end and takes part from the next sync on.
    pub joining: Vec<usize>,
}

impl Membership {
    /// Every rank of a world of `world_size` live, nobody joining: the membership of a world
    /// that never changes.
    pub fn full(world_size: usize, epoch: u64) -> Membership {
        Membership {
            epoch,
            live: vec![true; world_size],
            joining: Vec::new(),
        }
    }

    /// Whether every rank takes part.
    pub fn is_full(&self) -> bool {
        self.live.iter().all(|&l| l)
    }

    /// The live ranks, in rank order.
    pub fn live_ranks(&self) -> impl Iterator<Item = usize> + '_ {
        self.live
            .iter()
            .enumerate()
            .filter_map(|(rank, &l)| l.then_some(rank))
    }

    /// The rank the joining ranks are healed from: the lowest live rank.
    pub fn source(&self) -> Option<usize> {
        self.live_ranks().next()
    }
}

/// Which ranks take part in which sync point of a run: `live[k]` are the ranks whose
/// contributions sync point `k` averages. A rank absent from point `k` and present at `k + 1`
/// joins: it is healed at the end of point `k`. After the last listed point the last
/// membership stays.
///
/// ```
/// use distopt::comm::MembershipSchedule;
/// // Rank 2 leaves before sync 1 and comes back for sync 3.
/// let schedule = MembershipSchedule::new(3, vec![vec![0, 1, 2], vec![0, 1], vec![0, 1], vec![0, 1, 2]]).unwrap();
/// assert_eq!(schedule.at(1).live, vec![true, true, false]);
/// assert_eq!(schedule.at(2).joining, vec![2]);
/// assert!(schedule.at(7).is_full());
/// let err = MembershipSchedule::new(3, vec![vec![0, 3]]).unwrap_err();
/// assert_eq!(err.message(), "sync 0 of the membership schedule names rank 3, the world has 3 ranks");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipSchedule {
    world_size: usize,
    live: Vec<Vec<bool>>,
}

impl MembershipSchedule {
    /// The schedule of a world of `world_size` ranks: for each sync point, the live ranks.
    ///
    /// # Errors
    /// A `ValueError` naming the sync point when it lists no rank, a rank outside the world, or
    /// a rank twice.
    pub fn new(world_size: usize, syncs: Vec<Vec<usize>>) -> Result<MembershipSchedule> {
        let mut live = Vec::with_capacity(syncs.len());
        for (k, ranks) in syncs.iter().enumerate() {
            if ranks.is_empty() {
                return Err(Error::value(format!(
                    "sync {k} of the membership schedule has no live rank"
                )));
            }
            let mut mask = vec![false; world_size];
            for &rank in ranks {
                if rank >= world_size {
                    return Err(Error::value(format!(
                        "sync {k} of the membership schedule names rank {rank}, the world has {world_size} ranks"
                    )));
                }
                if mask[rank] {
                    return Err(Error::value(format!(
                        "sync {k} of the membership schedule names rank {rank} twice"
                    )));
                }
                mask[rank] = true;
            }
            live.push(mask);
        }
        Ok(MembershipSchedule { world_size, live })
    }

    /// A schedule written as text: each sync point's live ranks separated by `,`, the sync
    /// points by `;` (`"0,1,2,3;0,1,3;0,1,2,3"`; spaces are ignored).
    ///
    /// ```
    /// use distopt::comm::MembershipSchedule;
    /// let schedule = MembershipSchedule::parse(4, "0,1,2,3; 0,1,3").unwrap();
    /// assert_eq!(schedule.at(1).live, vec![true, true, false, true]);
    /// let err = MembershipSchedule::parse(4, "0,1;0,x").unwrap_err();
    /// assert_eq!(err.message(), "sync 1 of the membership schedule: 'x' is not a rank");
    /// ```
    ///
    /// # Errors
    /// A `ValueError` naming the sync point and the text that is not a rank, and those of
    /// [`MembershipSchedule::new`].
    pub fn parse(world_size: usize, text: &str) -> Result<MembershipSchedule> {
        let mut syncs = Vec::new();
        for (k, sync) in text.split(';').enumerate() {
            let mut ranks = Vec::new();
            for item in sync.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let rank = item.parse::<usize>().map_err(|_| {
                    Error::value(format!(
                        "sync {k} of the membership schedule: '{item}' is not a rank"
                    ))
                })?;
                ranks.push(rank);
            }
            syncs.push(ranks);
        }
        MembershipSchedule::new(world_size, syncs)
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Sync points listed.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no sync point is listed (every sync then has the whole world).
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    fn live_at(&self, k: usize) -> Vec<bool> {
        match self.live.get(k).or(self.live.last()) {
            Some(mask) => mask.clone(),
            None => vec![true; self.world_size],
        }
    }

    /// The membership of sync point `k`.
    pub fn at(&self, k: u64) -> Membership {
        let k = usize::try_from(k).unwrap_or(usize::MAX);
        let live = self.live_at(k);
        let next = self.live_at(k.saturating_add(1));
        let joining = (0..self.world_size)
            .filter(|&rank| next[rank] && !live[rank])
            .collect();
        Membership {
            epoch: k as u64,
            live,
            joining,
        }
    }
}
