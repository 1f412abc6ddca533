//! A sync point's mean in flight (Streaming DiLoCo's fragment during its
//! `fragment_sync_delay`): [`Communicator::start_all_reduce_mean_live`] takes this rank's
//! values, reserves the collective's two sequence numbers (the reduction and its vote, so that
//! every rank numbers the collectives that run meanwhile alike) and hands the exchange to a
//! background thread, which reduces and votes exactly as a blocking mean does (`commit.rs`).
//! [`Communicator::finish_all_reduce_mean_live`] waits for it and stores the sums, or, when a
//! rank died meanwhile and the vote failed, agrees on a new membership and reduces the same
//! values again over it, so the mean is applied on every live rank or on none.
//!
//! [`Communicator::start_all_reduce_mean_live`]: crate::comm::Communicator::start_all_reduce_mean_live
//! [`Communicator::finish_all_reduce_mean_live`]: crate::comm::Communicator::finish_all_reduce_mean_live

use std::ops::Range;
use std::sync::{Arc, Weak, mpsc};

use super::inbox::Inbox;
use super::{Job, NatsWorld, param_runs, rounds_to_itself, scratch_of};
use crate::backend::Arena;
use crate::backend::kernels::Real;
use crate::comm::{AllReduceMeanArgs, InFlightMean, Subgroups};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::transfer;

/// What the background exchange of a mean hands back.
struct Outcome {
    /// This rank's reduction: its sums are complete.
    reduced: Result<()>,
    /// The vote: every live rank holds its sums.
    committed: Result<bool>,
    /// The sums (as `f32` or `f64` by the arithmetic), then the contributions' buffer.
    buffers: [Vec<u64>; 2],
}

/// A mean in flight: what finishing it needs.
struct Travelling {
    world: Weak<NatsWorld>,
    outcome: mpsc::Receiver<Outcome>,
    inbox: Arc<Inbox>,
    seqs: [u64; 2],
    groups: Subgroups,
    live: Vec<bool>,
    arith: StorageFormat,
    runs: Vec<(Range<usize>, usize)>,
    members: Vec<usize>,
    voters: Vec<usize>,
    bytes_per_rank: u64,
}

impl Drop for Travelling {
    fn drop(&mut self) {
        for seq in self.seqs {
            self.inbox.close(seq);
        }
    }
}

impl NatsWorld {
    /// [`Communicator::start_all_reduce_mean_live`](crate::comm::Communicator::start_all_reduce_mean_live).
    pub(super) fn start_mean(
        &self,
        arena: &mut Arena,
        live: &[bool],
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<InFlightMean> {
        self.check_one_rank(arena, "all_reduce")?;
        crate::comm::check_live(live, self.size)?;
        mean.check(self.size)?;
        if !live[self.rank] {
            // Not in this sync: this rank keeps its data, as in the simulated world.
            return Ok(InFlightMean::done());
        }
        let this = self
            .this
            .upgrade()
            .ok_or_else(|| Error::runtime("this NATS world is being dropped"))?;
        let runs = param_runs(mean.starts, mean.active, arena.rank_len());
        // Ranks a vote already left out at an earlier sync of this point stay out.
        let known = self
            .elastic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone();
        let live: Vec<bool> = live.iter().zip(&known).map(|(&a, &b)| a && b).collect();
        let members: Vec<usize> = mean
            .groups
            .group_of(self.rank)
            .filter(|&r| live[r])
            .collect();
        let voters: Vec<usize> = (0..self.size).filter(|&r| live[r]).collect();
        let mut buffers = self.spare_buffers();
        let total: usize = runs.iter().map(|r| r.0.len()).sum();
        if mean.arith == StorageFormat::F64 {
            take_values::<f64>(arena, &runs, &mut buffers[0], total)?;
        } else {
            take_values::<f32>(arena, &runs, &mut buffers[0], total)?;
        }
        let seqs = [self.begin_open(), self.begin_open()];
        let (sender, outcome) = mpsc::channel();
        let (arith, job_members, job_voters) = (mean.arith, members.clone(), voters.clone());
        let job = move || {
            let outcome = this.exchange(seqs, arith, &job_members, &job_voters, buffers, total);
            let _ = sender.send(outcome);
        };
        let travelling = Travelling {
            world: self.this.clone(),
            outcome,
            inbox: self.inbox.clone(),
            seqs,
            groups: mean.groups,
            live,
            arith: mean.arith,
            runs,
            members,
            voters,
            bytes_per_rank: mean.bytes_per_rank,
        };
        self.in_background(Box::new(job))?;
        Ok(InFlightMean::travelling(Box::new(travelling)))
    }

    /// [`Communicator::finish_all_reduce_mean_live`](crate::comm::Communicator::finish_all_reduce_mean_live).
    pub(super) fn finish_mean(&self, arena: &mut Arena, in_flight: InFlightMean) -> Result<()> {
        let Some(state) = in_flight.into_state() else {
            return Ok(());
        };
        let travelling = state
            .downcast::<Travelling>()
            .ok()
            .filter(|t| t.world.ptr_eq(&self.this))
            .ok_or_else(|| {
                Error::runtime(format!(
                    "run '{}' rank {}: an all-reduce-mean in flight was started by another world",
                    self.run, self.rank
                ))
            })?;
        self.check_one_rank(arena, "all_reduce")?;
        let outcome = travelling.outcome.recv().map_err(|_| {
            Error::runtime(format!(
                "run '{}' rank {}: the exchange of a mean in flight ended without a result",
                self.run, self.rank
            ))
        })?;
        let Outcome {
            reduced,
            committed,
            mut buffers,
        } = outcome;
        let t = &*travelling;
        let members = if committed? {
            let stored = if t.arith == StorageFormat::F64 {
                store_values::<f64>(arena, &t.runs, &mut buffers[0])
            } else {
                store_values::<f32>(arena, &t.runs, &mut buffers[0])
            };
            self.keep_buffers(buffers);
            stored?;
            t.members.clone()
        } else {
            self.keep_buffers(buffers);
            self.check_vote_failure(reduced, &t.voters)?;
            // A rank died meanwhile: the survivors agree anew and average the values, which
            // the arena still holds, over each other (the live ranks of the new membership).
            let live = self.agree(true)?.live;
            let live: Vec<bool> = live.iter().zip(&t.live).map(|(&a, &b)| a && b).collect();
            self.mean_committed(arena, t.groups, &live, t.arith, &t.runs)?
        };
        self.record(|s| s.add_all_reduce(members.len(), t.bytes_per_rank));
        Ok(())
    }

    /// Starts a collective that stays open while later ones begin: its sequence number.
    fn begin_open(&self) -> u64 {
        let seq = self.begin();
        self.inbox.hold_open(seq);
        seq
    }

    /// The reduction and the vote of a mean in flight, on the background thread.
    fn exchange(
        &self,
        seqs: [u64; 2],
        arith: StorageFormat,
        members: &[usize],
        voters: &[usize],
        mut buffers: [Vec<u64>; 2],
        total: usize,
    ) -> Outcome {
        let [values, received] = &mut buffers;
        let reduced = if arith == StorageFormat::F64 {
            self.mean_at::<f64>(seqs[0], received, arith, members, values, total)
        } else {
            self.mean_at::<f32>(seqs[0], received, arith, members, values, total)
        };
        let committed = self.vote_at(seqs[1], voters, reduced.is_ok());
        Outcome {
            reduced,
            committed,
            buffers,
        }
    }

    /// The mean over `members` of the `total` values in `values`, as collective `seq`.
    fn mean_at<T: Real + bytemuck::Pod>(
        &self,
        seq: u64,
        received: &mut Vec<u64>,
        arith: StorageFormat,
        members: &[usize],
        values: &mut Vec<u64>,
        total: usize,
    ) -> Result<()> {
        let divisor = T::scalar(members.len() as f64);
        let data: &mut [T] = scratch_of(values, total);
        if rounds_to_itself::<T>(arith) {
            self.reduce_at(seq, received, arith, members, data, false, |x| x / divisor)
        } else {
            self.reduce_at(seq, received, arith, members, data, false, |x| {
                T::round(arith, x / divisor)
            })
        }
    }

    /// Runs `job` on this world's background thread, started at the first job.
    fn in_background(&self, job: Job) -> Result<()> {
        let mut worker = self.background.lock().unwrap_or_else(|e| e.into_inner());
        if worker.is_none() {
            let (sender, jobs) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("distopt-nats-overlap".into())
                .spawn(move || {
                    // Ends when the world, which holds the sender, is dropped.
                    for job in jobs {
                        job();
                    }
                })
                .map_err(|e| {
                    Error::runtime(format!(
                        "run '{}' rank {}: cannot start the background exchange: {e}",
                        self.run, self.rank
                    ))
                })?;
            *worker = Some(sender);
        }
        worker
            .as_ref()
            .expect("started above")
            .send(job)
            .map_err(|_| {
                Error::runtime(format!(
                    "run '{}' rank {}: the background exchange has stopped",
                    self.run, self.rank
                ))
            })
    }

    /// Buffers for a mean in flight, kept from the last one.
    fn spare_buffers(&self) -> [Vec<u64>; 2] {
        let mut spare = self
            .in_flight_buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        [
            spare.pop().unwrap_or_default(),
            spare.pop().unwrap_or_default(),
        ]
    }

    /// Keeps a finished mean's buffers for the next one.
    fn keep_buffers(&self, buffers: [Vec<u64>; 2]) {
        let mut spare = self
            .in_flight_buffers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        spare.clear();
        spare.extend(buffers);
    }
}

/// This rank's values of `runs` as `T`, into the first `total` elements of `buffer`.
fn take_values<T: Real + bytemuck::Pod>(
    arena: &mut Arena,
    runs: &[(Range<usize>, usize)],
    buffer: &mut Vec<u64>,
    total: usize,
) -> Result<()> {
    let data: &mut [T] = scratch_of(buffer, total);
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return Ok(());
    };
    let format = arena.format();
    transfer::with_row_words(arena, first.0.start..last.0.end, |words, base| {
        let mut k = 0;
        for (run, _) in runs {
            for i in run.clone() {
                data[k] = T::load(format, words, i - base);
                k += 1;
            }
        }
        Ok(())
    })
}

/// Writes the sums of `runs` held as `T` in `buffer` to the arena.
pub(super) fn store_values<T: Real + bytemuck::Pod>(
    arena: &mut Arena,
    runs: &[(Range<usize>, usize)],
    buffer: &mut Vec<u64>,
) -> Result<()> {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return Ok(());
    };
    let format = arena.format();
    let total: usize = runs.iter().map(|r| r.0.len()).sum();
    let out: &mut [T] = scratch_of(buffer, total);
    transfer::with_row_words(arena, first.0.start..last.0.end, |words, base| {
        let mut k = 0;
        for (run, _) in runs {
            for i in run.clone() {
                T::store(format, words, i - base, out[k]);
                k += 1;
            }
        }
        Ok(())
    })
}
