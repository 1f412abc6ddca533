//! A sync point's mean applied on every live rank or on none (torchft's commit of a step).
//!
//! An elastic algorithm's mean ([`Communicator::all_reduce_mean_live`]) is reduced into the
//! scratch buffer with the arena untouched; then every live rank publishes a vote, "I hold my
//! whole result", and waits for every other live rank's vote (or for the voter to be silent
//! for the failure bound). Every rank applies the sum only when every vote arrived and is yes,
//! so the survivors decide alike: a vote reaches all of them or none. Otherwise nobody applies
//! it: the survivors agree on a new membership ([`Communicator::membership`], which leaves out
//! the rank that died) and reduce the same values again over it, as the simulated world
//! computes a sync point that rank was not live at. A rank whose own reduction failed for
//! another reason (a refused frame) votes no and returns its error.
//!
//! A synchronous algorithm's mean ([`Communicator::all_reduce_mean`]) takes no vote: a rank
//! that dies fails it on every survivor, as before.

use std::ops::Range;

use super::overlap::store_values;
use super::{KIND_VOTE, NatsWorld, Sum, param_runs};
use crate::backend::Arena;
use crate::comm::wire::{Assembler, MessageId};
use crate::comm::{AllReduceMeanArgs, MeanOrder, Subgroups};
use crate::dtype::StorageFormat;
use crate::error::Result;

impl NatsWorld {
    /// The mean of [`Communicator::all_reduce_mean_live`] (`elastic`: committed as the module
    /// says) or of [`Communicator::all_reduce_mean`] (not `elastic`: stored as it completes).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mean_over(
        &self,
        arena: &mut Arena,
        live: &[bool],
        mean: AllReduceMeanArgs<'_>,
        elastic: bool,
    ) -> Result<()> {
        self.check_one_rank(arena, "all_reduce")?;
        crate::comm::check_live(live, self.size)?;
        mean.check(self.size)?;
        if !live[self.rank] {
            // Not in this sync: this rank keeps its data, as in the simulated world.
            return Ok(());
        }
        let runs = param_runs(mean.starts, mean.active, arena.rank_len());
        let members = if elastic {
            self.mean_committed(arena, mean.groups, live, (mean.arith, mean.order), &runs)?
        } else {
            let members: Vec<usize> = mean
                .groups
                .group_of(self.rank)
                .filter(|&r| live[r])
                .collect();
            let how = (mean.arith, mean.order);
            self.mean_in(arena, how, &members, &runs, Sum::Stored)?;
            members
        };
        self.record(|s| s.add_all_reduce(members.len(), mean.bytes_per_rank));
        Ok(())
    }

    /// The committed mean: reduce, vote, apply or agree on a new membership and reduce again.
    /// Returns the members of this rank's group the mean was taken over.
    pub(super) fn mean_committed(
        &self,
        arena: &mut Arena,
        groups: Subgroups,
        live: &[bool],
        how: (StorageFormat, MeanOrder),
        runs: &[(Range<usize>, usize)],
    ) -> Result<Vec<usize>> {
        // Ranks a vote already left out at an earlier sync of this point stay out.
        let known = self
            .elastic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone();
        let mut live: Vec<bool> = live.iter().zip(&known).map(|(&a, &b)| a && b).collect();
        loop {
            let members: Vec<usize> = groups.group_of(self.rank).filter(|&r| live[r]).collect();
            let reduced = self.mean_in(arena, how, &members, runs, Sum::Held);
            let voters: Vec<usize> = (0..self.size).filter(|&r| live[r]).collect();
            if self.vote(&voters, reduced.is_ok())? {
                self.store_in(arena, how.0, runs)?;
                return Ok(members);
            }
            self.check_vote_failure(reduced, &voters)?;
            live = self.agree(true)?.live;
        }
    }

    /// After a vote that did not commit: `Ok` when a voter is gone, so that the caller agrees
    /// on a new membership and reduces again over it; otherwise this rank's own failure to
    /// reduce (`reduced`), which is not a departure.
    ///
    /// # Errors
    /// `reduced`'s error when no other voter has been silent for the failure bound.
    pub(super) fn check_vote_failure(&self, reduced: Result<()>, voters: &[usize]) -> Result<()> {
        if let Err(e) = reduced {
            let someone_gone = voters
                .iter()
                .any(|&r| r != self.rank && self.inbox.silent_for(r) > self.bound);
            if !someone_gone {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The mean over `members` in `how`'s precision and order (see [`NatsWorld::mean_arena`]).
    pub(super) fn mean_in(
        &self,
        arena: &mut Arena,
        how: (StorageFormat, MeanOrder),
        members: &[usize],
        runs: &[(Range<usize>, usize)],
        sum: Sum,
    ) -> Result<()> {
        let (arith, order) = how;
        if arith == StorageFormat::F64 {
            self.mean_arena::<f64>(arena, arith, order, members, runs, sum)
        } else {
            self.mean_arena::<f32>(arena, arith, order, members, runs, sum)
        }
    }

    fn store_in(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        runs: &[(Range<usize>, usize)],
    ) -> Result<()> {
        if arith == StorageFormat::F64 {
            store_values::<f64>(
                arena,
                runs,
                &mut self.scratch.lock().unwrap_or_else(|e| e.into_inner()),
            )
        } else {
            store_values::<f32>(
                arena,
                runs,
                &mut self.scratch.lock().unwrap_or_else(|e| e.into_inner()),
            )
        }
    }

    /// Publishes this rank's vote (`yes`) and gathers the other `voters`' votes: true when
    /// every one arrived and is yes. A voter silent for the failure bound counts as no.
    ///
    /// # Errors
    /// A `RuntimeError` when the vote cannot be published or a frame was refused.
    fn vote(&self, voters: &[usize], yes: bool) -> Result<bool> {
        let seq = self.begin();
        self.vote_at(seq, voters, yes)
    }

    /// [`NatsWorld::vote`] as collective `seq`.
    ///
    /// # Errors
    /// Those of [`NatsWorld::vote`].
    pub(super) fn vote_at(&self, seq: u64, voters: &[usize], yes: bool) -> Result<bool> {
        self.send(&self.common, seq, KIND_VOTE, &[u8::from(yes)])?;
        let mut commit = yes;
        for &rank in voters.iter().filter(|&&r| r != self.rank) {
            let id = MessageId {
                from: rank as u32,
                ..self.id(seq, KIND_VOTE)
            };
            let vote = self.inbox.receive_unless_gone(
                Assembler::new(id, 1),
                self.bound,
                &self.run,
                true,
            )?;
            commit &= vote.as_deref() == Some(&[1u8][..]);
        }
        Ok(commit)
    }
}
