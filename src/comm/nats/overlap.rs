//! A sync point in flight (Streaming DiLoCo's fragment during its `fragment_sync_delay`):
//! [`Communicator::start_membership`] queues the membership agreement on a background thread
//! (in wasm, which has no thread to spare, it is a future that
//! [`Communicator::progress_membership`] moves on between the caller's inner steps, and the
//! exchange below runs when the mean is finished);
//! [`Communicator::start_all_reduce_mean_in`] takes this rank's values, reserves the mean's two
//! sequence numbers (its reduction and its vote, so that every rank numbers the collectives
//! that run meanwhile alike) and queues the exchange behind the agreement, which reduces over
//! the agreed live ranks and votes exactly as a blocking mean does (`commit.rs`).
//! [`Communicator::finish_all_reduce_mean_live`] waits for it and stores the sums, or, when a
//! rank died meanwhile and the vote failed, agrees on a new membership and reduces the same
//! values again over it, so the mean is applied on every live rank or on none. The ranks the
//! agreement admits are awaited from [`Communicator::finish_membership`] on, when they are
//! healed.
//!
//! [`Communicator::start_membership`]: crate::comm::Communicator::start_membership
//! [`Communicator::start_all_reduce_mean_in`]: crate::comm::Communicator::start_all_reduce_mean_in
//! [`Communicator::finish_all_reduce_mean_live`]: crate::comm::Communicator::finish_all_reduce_mean_live
//! [`Communicator::finish_membership`]: crate::comm::Communicator::finish_membership
//! [`Communicator::progress_membership`]: crate::comm::Communicator::progress_membership

use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, Weak, mpsc};

use super::inbox::Inbox;
use super::{Job, NatsWorld, param_runs, rounds_to_itself, scratch_of, store_runs};
use crate::backend::Arena;
use crate::backend::kernels::Real;
use crate::comm::{
    AllReduceMeanArgs, InFlightMean, InFlightMembership, MeanOrder, Membership, Subgroups,
};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::transfer;

/// The agreement of a sync point as a future: in wasm, polled between the caller's steps.
type Agreeing = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Membership>> + Send>>;

/// A membership being agreed on the background thread (in wasm: between the caller's steps):
/// set once, read by the means queued behind it and by [`NatsWorld::finish_agreement`].
struct Agreement {
    world: Weak<NatsWorld>,
    result: Mutex<Option<Result<Membership>>>,
    agreed: Condvar,
    /// In wasm, the agreement itself until it is done: [`Agreement::progress`] polls it
    /// without blocking, [`Agreement::wait`] to its end.
    agreeing: Mutex<Option<Agreeing>>,
}

impl Agreement {
    fn new(world: Weak<NatsWorld>, result: Option<Result<Membership>>) -> Arc<Agreement> {
        Arc::new(Agreement {
            world,
            result: Mutex::new(result),
            agreed: Condvar::new(),
            agreeing: Mutex::new(None),
        })
    }

    /// Moves the agreement on as far as it goes without waiting (a key-value operation is a
    /// round trip to the server; the wait for the other ranks' arrivals is not waited for).
    fn progress(&self) {
        let mut agreeing = self.agreeing.lock().unwrap_or_else(|e| e.into_inner());
        let Some(future) = agreeing.as_mut() else {
            return;
        };
        if let std::task::Poll::Ready(result) = super::link::poll_between_steps(future.as_mut()) {
            *agreeing = None;
            drop(agreeing);
            self.set(result);
        }
    }

    fn set(&self, result: Result<Membership>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        self.agreed.notify_all();
    }

    fn wait(&self) -> Result<Membership> {
        let agreeing = self
            .agreeing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let (Some(future), Some(world)) = (agreeing, self.world.upgrade()) {
            self.set(world.runtime.block_on(future));
        }
        let mut result = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(result) = result.as_ref() {
                return result.clone();
            }
            result = self.agreed.wait(result).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What the background exchange of a mean hands back.
struct Outcome {
    /// The ranks it was taken over: the live ranks, this rank's group of them and the
    /// voters; `None` when this rank is not live (it keeps its data).
    over: Option<(Vec<bool>, Vec<usize>, Vec<usize>)>,
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
    arith: StorageFormat,
    order: MeanOrder,
    runs: Vec<(Range<usize>, usize)>,
    bytes_per_rank: u64,
    /// In wasm, the exchange itself, run when the mean is finished.
    exchange: Option<Job>,
}

impl Drop for Travelling {
    fn drop(&mut self) {
        // A mean abandoned before its finish (the caller failed first) still takes its part
        // in the exchange, as the background thread does natively: the other ranks wait for
        // this rank's values, and it is still heard from.
        if let Some(exchange) = self.exchange.take() {
            exchange();
        }
        for seq in self.seqs {
            self.inbox.close(seq);
        }
    }
}

impl NatsWorld {
    /// [`Communicator::start_membership`](crate::comm::Communicator::start_membership): a
    /// joining process, which has no sync point of its own to agree on, waits for its
    /// admission now.
    pub(super) fn start_agreement(&self) -> Result<InFlightMembership> {
        let joining = self
            .joining_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if joining {
            return Ok(InFlightMembership::done(self.agree(false)?));
        }
        let this = self.strong()?;
        let agreement = Agreement::new(self.this.clone(), None);
        if cfg!(target_arch = "wasm32") {
            // No thread to spare: the agreement moves on between the caller's steps.
            *agreement.agreeing.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Box::pin(this.agree_in_flight()));
            agreement.progress();
            return Ok(InFlightMembership::agreeing(Box::new(agreement)));
        }
        let slot = agreement.clone();
        self.in_background(Box::new(move || slot.set(this.agree_with(false, true))))?;
        Ok(InFlightMembership::agreeing(Box::new(agreement)))
    }

    /// The agreement of a sync point in flight as a future (wasm's, polled between the
    /// caller's steps): [`NatsWorld::agree`]'s, whose joiners are awaited from
    /// [`NatsWorld::finish_agreement`] on.
    async fn agree_in_flight(self: Arc<NatsWorld>) -> Result<Membership> {
        let (k, previous) = {
            let elastic = self.elastic.lock().unwrap_or_else(|e| e.into_inner());
            (elastic.0, elastic.1.clone())
        };
        let mut watch = self.watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        let watched_before = watch.is_some();
        let agreed = self
            .agree_at(k, &previous, &mut watch, watched_before)
            .await;
        *self.watch.lock().unwrap_or_else(|e| e.into_inner()) = watch;
        let mut elastic = self.elastic.lock().unwrap_or_else(|e| e.into_inner());
        if elastic.0 != k {
            return Err(Error::runtime(format!(
                "run '{}' rank {}: sync point {k} in flight: another agreement ran meanwhile",
                self.run, self.rank
            )));
        }
        self.conclude(&mut elastic, &previous, agreed?, false, true)
    }

    /// [`Communicator::progress_membership`](crate::comm::Communicator::progress_membership).
    pub(super) fn progress_agreement(&self, membership: &InFlightMembership) {
        if let Ok(agreement) = self.agreement_of(membership.state().and_then(|s| s.downcast_ref()))
        {
            agreement.progress();
        }
    }

    /// [`Communicator::finish_membership`](crate::comm::Communicator::finish_membership): from
    /// now on the ranks it admits are awaited.
    pub(super) fn finish_agreement(&self, membership: InFlightMembership) -> Result<Membership> {
        let agreed = match membership.into_inner() {
            Ok(agreed) => agreed,
            Err(state) => self.agreement_of(state.downcast_ref())?.wait()?,
        };
        self.expect_joiners(&agreed);
        Ok(agreed)
    }

    /// The ranks `agreed` admits are awaited by this process's collectives from now on.
    fn expect_joiners(&self, agreed: &Membership) {
        if !agreed.joining.is_empty() {
            self.inbox.set_live(&NatsWorld::with_joining(agreed));
        }
    }

    /// [`Communicator::start_all_reduce_mean_in`](crate::comm::Communicator::start_all_reduce_mean_in).
    pub(super) fn start_mean(
        &self,
        arena: &mut Arena,
        membership: &InFlightMembership,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<InFlightMean> {
        self.check_one_rank(arena, "all_reduce")?;
        mean.check(self.size)?;
        let agreement = match (membership.agreed(), membership.state()) {
            (Some(agreed), _) => {
                crate::comm::check_live(&agreed.live, self.size)?;
                Agreement::new(self.this.clone(), Some(Ok(agreed.clone())))
            }
            (None, state) => self.agreement_of(state.and_then(|s| s.downcast_ref()))?,
        };
        let this = self.strong()?;
        let runs = param_runs(mean.starts, mean.active, arena.rank_len());
        let mut buffers = self.spare_buffers();
        let total: usize = runs.iter().map(|r| r.0.len()).sum();
        if mean.arith == StorageFormat::F64 {
            take_values::<f64>(arena, &runs, &mut buffers[0], total)?;
        } else {
            take_values::<f32>(arena, &runs, &mut buffers[0], total)?;
        }
        let seqs = [self.begin_open(), self.begin_open()];
        let (sender, outcome) = mpsc::channel();
        let (groups, how) = (mean.groups, (mean.arith, mean.order));
        let job = move || {
            let outcome = match agreement.wait() {
                Ok(agreed) => this.exchange(seqs, &agreed.live, groups, how, buffers, total),
                Err(e) => Outcome {
                    over: None,
                    reduced: Err(e.clone()),
                    committed: Err(e),
                    buffers,
                },
            };
            let _ = sender.send(outcome);
        };
        let mut travelling = Travelling {
            world: self.this.clone(),
            outcome,
            inbox: self.inbox.clone(),
            seqs,
            groups: mean.groups,
            arith: mean.arith,
            order: mean.order,
            runs,
            bytes_per_rank: mean.bytes_per_rank,
            exchange: None,
        };
        if cfg!(target_arch = "wasm32") {
            // The exchange waits for the other ranks' values: without a thread of its own it
            // runs where every rank comes in the same order, when the mean is finished (the
            // agreement it waits for has moved on between the steps).
            travelling.exchange = Some(Box::new(job));
        } else {
            self.in_background(Box::new(job))?;
        }
        Ok(InFlightMean::travelling(Box::new(travelling)))
    }

    /// [`Communicator::finish_all_reduce_mean_live`](crate::comm::Communicator::finish_all_reduce_mean_live).
    pub(super) fn finish_mean(&self, arena: &mut Arena, in_flight: InFlightMean) -> Result<()> {
        let Some(state) = in_flight.into_state() else {
            return Ok(());
        };
        let mut travelling = state
            .downcast::<Travelling>()
            .ok()
            .filter(|t| t.world.ptr_eq(&self.this))
            .ok_or_else(|| self.foreign("an all-reduce-mean"))?;
        self.check_one_rank(arena, "all_reduce")?;
        if let Some(exchange) = travelling.exchange.take() {
            exchange();
        }
        let outcome = travelling.outcome.recv().map_err(|_| {
            Error::runtime(format!(
                "run '{}' rank {}: the exchange of a mean in flight ended without a result",
                self.run, self.rank
            ))
        })?;
        let Outcome {
            over,
            reduced,
            committed,
            mut buffers,
        } = outcome;
        let t = &*travelling;
        // A committed mean's sums go to the arena; then the buffers serve the next mean.
        let stored = match (&over, &committed) {
            (Some(_), Ok(true)) if t.arith == StorageFormat::F64 => {
                store_values::<f64>(arena, &t.runs, &mut buffers[0])
            }
            (Some(_), Ok(true)) => store_values::<f32>(arena, &t.runs, &mut buffers[0]),
            _ => Ok(()),
        };
        self.keep_buffers(buffers);
        stored?;
        let Some((live, members, voters)) = over else {
            // The agreement failed (`committed` holds why), or this rank is not live.
            return committed.map(drop);
        };
        let members = if committed? {
            members
        } else {
            self.check_vote_failure(reduced, &voters)?;
            // A rank died meanwhile: the survivors agree anew and average the values, which
            // the arena still holds, over each other (the live ranks of the new membership).
            let again = self.agree(true)?.live;
            let again: Vec<bool> = again.iter().zip(&live).map(|(&a, &b)| a && b).collect();
            self.mean_committed(arena, t.groups, &again, (t.arith, t.order), &t.runs)?
        };
        self.record(|s| s.add_all_reduce(members.len(), t.bytes_per_rank));
        Ok(())
    }

    /// This world, for a job on the background thread.
    fn strong(&self) -> Result<Arc<NatsWorld>> {
        self.this
            .upgrade()
            .ok_or_else(|| Error::runtime("this NATS world is being dropped"))
    }

    /// The agreement behind a membership in flight, if this world started it.
    fn agreement_of(&self, state: Option<&Arc<Agreement>>) -> Result<Arc<Agreement>> {
        state
            .filter(|a| a.world.ptr_eq(&self.this))
            .cloned()
            .ok_or_else(|| self.foreign("a membership"))
    }

    fn foreign(&self, what: &str) -> Error {
        Error::runtime(format!(
            "run '{}' rank {}: {what} in flight was started by another world",
            self.run, self.rank
        ))
    }

    /// Starts a collective that stays open while later ones begin: its sequence number.
    fn begin_open(&self) -> u64 {
        let seq = self.begin();
        self.inbox.hold_open(seq);
        seq
    }

    /// The reduction and the vote of a mean in flight over the `live` ranks, on the
    /// background thread.
    fn exchange(
        &self,
        seqs: [u64; 2],
        live: &[bool],
        groups: Subgroups,
        how: (StorageFormat, MeanOrder),
        mut buffers: [Vec<u64>; 2],
        total: usize,
    ) -> Outcome {
        if !live.get(self.rank).copied().unwrap_or(false) {
            return Outcome {
                over: None,
                reduced: Ok(()),
                committed: Ok(true),
                buffers,
            };
        }
        let members: Vec<usize> = groups.group_of(self.rank).filter(|&r| live[r]).collect();
        let voters: Vec<usize> = (0..self.size).filter(|&r| live[r]).collect();
        let [values, received] = &mut buffers;
        let reduced = if how.0 == StorageFormat::F64 {
            self.mean_at::<f64>(seqs[0], received, how, &members, values, total)
        } else {
            self.mean_at::<f32>(seqs[0], received, how, &members, values, total)
        };
        let committed = self.vote_at(seqs[1], &voters, reduced.is_ok());
        Outcome {
            over: Some((live.to_vec(), members, voters)),
            reduced,
            committed,
            buffers,
        }
    }

    /// The mean over `members` of the `total` values in `values`, as collective `seq`, in
    /// `how`'s precision and order (see [`NatsWorld::mean_arena`]).
    fn mean_at<T: Real + bytemuck::Pod>(
        &self,
        seq: u64,
        received: &mut Vec<u64>,
        how: (StorageFormat, MeanOrder),
        members: &[usize],
        values: &mut Vec<u64>,
        total: usize,
    ) -> Result<()> {
        let (arith, order) = how;
        let divisor = T::scalar(members.len() as f64);
        let data: &mut [T] = scratch_of(values, total);
        let round = |x: T| T::round(arith, x);
        match (order, rounds_to_itself::<T>(arith)) {
            (MeanOrder::DivideThenSum, true) => {
                let each = |x| x / divisor;
                self.reduce_at(seq, received, arith, members, data, false, each, |s| s)
            }
            (MeanOrder::DivideThenSum, false) => {
                let each = |x| round(x / divisor);
                self.reduce_at(seq, received, arith, members, data, false, each, |s| s)
            }
            (MeanOrder::SumThenDivide, _) => {
                let mean = |s| round(s / divisor);
                self.reduce_at(seq, received, arith, members, data, false, round, mean)
            }
        }
    }

    /// Runs `job` on this world's background thread, started at the first job; jobs run in
    /// the order they were queued. (A wasm rank, which has no thread to spare, never comes
    /// here: `start_agreement` and `start_mean` keep its work for between and after its steps.)
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
        spare.extend(buffers.into_iter().filter(|b| !b.is_empty()));
        spare.truncate(4);
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
        store_runs(format, words, base, runs, out);
        Ok(())
    })
}
