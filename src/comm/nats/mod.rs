//! One rank per process over a NATS server (feature `nats`): [`NatsWorld`] is the
//! [`Communicator`] of a *run*, a name that R processes join (each started on its own, on any
//! machine that reaches the server), each holding one rank's arenas on its own backend.
//!
//! - **Rendezvous** (`join.rs`): a JetStream key-value bucket per run assigns ranks.
//! - **Transport**: every process subscribes to a subject of its own (point-to-point) and to
//!   the run's common subject (broadcasts, heartbeats). Messages are cut into the frames of
//!   [`super::wire`] under the server's `max_payload`, each naming run, epoch, collective
//!   and sender and carrying its sender's seal; nothing a peer sends is trusted before it is checked.
//! - **Ranks bound to their claims** (`seal.rs`): each process's claim carries a fresh NKey,
//!   and every frame is sealed with it; a frame another client publishes in a rank's name is
//!   dropped and counted ([`NatsWorld::forged_frames`]), never summed.
//! - **Reductions in rank order**, so results are bit-identical to the [`SimulatedWorld`]'s:
//!   each group member owns a contiguous shard of the elements, receives every member's
//!   contribution to it (as stored; the owner divides it by the group size, or scales it,
//!   rounded as the reference kernel rounds it), sums them in rank order with the reference kernel's rounding
//!   and sends the sum back to every member. Each rank sends and receives `2·(g−1)/g` of the
//!   data, as in a ring all-reduce.
//! - **Failures**: every process publishes a heartbeat every [`HEARTBEAT`]; a collective waiting
//!   on a rank that has been silent for the failure bound ([`NatsOptions::failure_bound`],
//!   5 s unless set) fails with a `RuntimeError` naming the rank, so no survivor hangs and no
//!   partial sum is stored.
//! - **Elastic sync points** (`membership.rs`): DiLoCo's and the averagers' syncs agree on
//!   their live ranks through the run's bucket ([`Communicator::membership`]); a rank that
//!   left (silent for the failure bound) is dropped at the next sync point, and the survivors
//!   average over each other only, on the bits of the simulated world replaying that
//!   membership. A sync's mean is committed (`commit.rs`): applied on every live rank or, when
//!   a rank dies during it, on none, the survivors then averaging again without it.
//! - **Means in flight** (`overlap.rs`): Streaming DiLoCo's fragment all-reduce travels on a
//!   background thread during its `fragment_sync_delay` while the inner steps run
//!   ([`Communicator::start_membership`], [`Communicator::start_all_reduce_mean_in`]): the
//!   agreement and the means, committed as any sync point's mean.
//! - **Joining a running run** (`heal.rs`, [`NatsOptions::join`]): a process takes the rank of
//!   one that left, is admitted at the next sync point and healed at its end from the lowest
//!   live rank, point to point ([`Communicator::heal_rows`]).
//!
//! [`SimulatedWorld`]: super::SimulatedWorld

mod commit;
mod heal;
mod inbox;
mod join;
pub mod link;
mod membership;
#[cfg(not(target_arch = "wasm32"))]
mod native;
mod options;
mod overlap;
mod permissions;
#[cfg(not(target_arch = "wasm32"))]
mod raw;
mod runtime;
mod seal;

pub use options::NatsOptions;
pub use permissions::{
    RunCredentials, RunPermissions, ServerListen, run_permissions, server_config,
};
#[cfg(not(target_arch = "wasm32"))]
pub use raw::RawPeer;

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::param_runs::param_runs;
use super::regions::Words;
use super::scratch::scratch_of;
use super::wire::{self, Assembler, MessageId};
use super::{
    AllReduceMeanArgs, AllReduceScaledSumArgs, BroadcastRegion, CommStats, Communicator,
    InFlightMean, InFlightMembership, MeanOrder, Membership, StatsCounter, one_rank, regions,
};
use crate::backend::kernels::Real;
use crate::backend::{Arena, Backend};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};
use crate::transfer;
use inbox::{Inbox, KIND_HEARTBEAT, KIND_LEAVING};
use link::{Bucket, Link, LinkResult, Pending, Refused, Task};
use runtime::Runtime;

/// What the one-rank checks call a process of this world.
const HOLDER: &str = "a process of a NATS run";

/// How often a process says it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// Frame buffers a world keeps for its next sends.
const SPARE_FRAMES: usize = 32;

/// A contribution to a reduction's shard.
const KIND_CONTRIBUTION: u8 = 1;
/// A reduced shard, from its owner.
const KIND_RESULT: u8 = 2;
/// A broadcast's data.
const KIND_BROADCAST: u8 = 3;
/// One rank's part of a gather.
const KIND_GATHER: u8 = 4;
/// A rank's vote on committing a sync point's mean (`commit.rs`).
const KIND_VOTE: u8 = 5;
/// Part of a joining rank's heal, from its source (`heal.rs`).
const KIND_HEAL: u8 = 6;

/// Work for the background thread that moves means in flight (`overlap.rs`).
type Job = Box<dyn FnOnce() + Send>;

/// What a reduction of arena values does with the sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sum {
    /// Written to the arena as soon as it is complete.
    Stored,
    /// Not written (a rank that only contributes).
    Dropped,
    /// Kept in the scratch buffer, the arena untouched, until the reduction is committed.
    Held,
}

/// This process's rank of a run over NATS (see the module documentation).
pub struct NatsWorld {
    rank: usize,
    size: usize,
    run: String,
    run_id: u64,
    bound: Duration,
    max_frame: usize,
    /// Each rank's own subject, by rank.
    subjects: Mutex<Vec<String>>,
    /// The run's common subject: broadcasts and heartbeats.
    common: String,
    inbox: Arc<Inbox>,
    /// The next collective's sequence number.
    seq: Mutex<u64>,
    /// Sync points so far, and the live ranks agreed at the last one.
    elastic: Mutex<(u64, Vec<bool>)>,
    /// A joining process, until its first [`Communicator::membership`] asks to be taken in:
    /// the run's last sync point when it took its rank (`heal.rs`).
    joining_after: Mutex<Option<u64>>,
    /// How long a joining process waits to be taken in.
    join_timeout: Duration,
    /// The sync points whose membership changed (ranks left, or joined after it), each with
    /// the algorithm's index of the sync point as its epoch.
    changes: Mutex<Vec<(Membership, web_time::SystemTime)>>,
    /// The algorithms' sync points so far: the agreements less those made again within one
    /// (a rank that died during a sync point's mean, `commit.rs`).
    points: Mutex<u64>,
    /// The membership epoch of the heals under way, and the messages of it sent or received
    /// (`heal.rs`).
    heal: Mutex<(u64, std::collections::BTreeMap<usize, u64>)>,
    /// Whether the heartbeat is published: from the start, or for a joining process once it
    /// is being healed (before, its key is not yet the run's for its rank).
    beating: Arc<std::sync::atomic::AtomicBool>,
    stats: StatsCounter,
    /// Where a reduction of arena values that cannot be reduced in place is made (the
    /// values, then the sums), kept between calls (`u64` storage keeps every element type
    /// aligned).
    scratch: Mutex<Vec<u64>>,
    /// Where a reduction assembles each contribution it receives, kept between calls.
    received: Mutex<Vec<u64>>,
    /// Buffers of frames sent, for the next frames (at most [`SPARE_FRAMES`]).
    spare: Mutex<Vec<Vec<u8>>>,
    /// Buffers of the last mean in flight, for the next one (`overlap.rs`).
    in_flight_buffers: Mutex<Vec<Vec<u64>>>,
    /// The thread that moves means in flight, once one was started (`overlap.rs`).
    background: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    /// This world, for the background thread's jobs.
    this: std::sync::Weak<NatsWorld>,
    /// This process's key: it seals every frame it sends (`seal.rs`).
    signer: Arc<seal::Signer>,
    /// Updates of the bucket's sync points, which wake a membership agreement
    /// (`membership.rs`), once the first one was made.
    watch: Mutex<Option<Box<dyn link::Watch>>>,
    /// The run's key-value bucket (`join.rs`, `membership.rs`).
    bucket: Box<dyn Bucket>,
    /// The connection to the server (`link.rs`).
    link: Arc<dyn Link>,
    /// The subscriptions and the heartbeat.
    tasks: Mutex<Vec<Task>>,
    /// Declared last: dropped after the link and the tasks that use it.
    runtime: Runtime,
}

impl std::fmt::Debug for NatsWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsWorld")
            .field("run", &self.run)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// A token no other process holds: a digest of this process's fresh key (random), and the
/// time.
fn process_token(signer: &seal::Signer) -> String {
    let mut h = blake3::Hasher::new();
    h.update(signer.public_key().as_bytes());
    h.update(
        &web_time::SystemTime::now()
            .duration_since(web_time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            .to_le_bytes(),
    );
    h.finalize().to_hex()[..16].to_string()
}

impl NatsWorld {
    /// Connects to the server, joins run `options.run` and waits until all its ranks have
    /// joined.
    ///
    /// # Errors
    /// A `ValueError` for a run name that is not a subject token, no ranks, or a requested rank
    /// outside the run; a `RuntimeError` when the server cannot be reached, has no JetStream,
    /// the rank asked for is taken (or every rank is), or the run is not complete within
    /// `options.join_timeout`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn join(options: &NatsOptions) -> Result<Arc<NatsWorld>> {
        NatsWorld::check_options(options)?;
        let runtime = Runtime::new(&options.run)?;
        let link = runtime.block_on(native::NativeLink::connect(options))?;
        NatsWorld::join_with(options, runtime, Arc::new(link))
    }

    /// [`NatsWorld::join`] over `link`, a connection to the server of a client other than the
    /// native one (the npm package's nats.js port, say): `options`' URL, token, secret and TLS
    /// authorities are the link's business, not read here.
    ///
    /// # Errors
    /// Those of [`NatsWorld::join`].
    pub fn join_over(options: &NatsOptions, link: Arc<dyn Link>) -> Result<Arc<NatsWorld>> {
        NatsWorld::check_options(options)?;
        let runtime = Runtime::new(&options.run)?;
        NatsWorld::join_with(options, runtime, link)
    }

    fn check_options(options: &NatsOptions) -> Result<()> {
        join::check_run_name(&options.run)?;
        if options.ranks == 0 {
            return Err(Error::value("a run needs at least one rank"));
        }
        Ok(())
    }

    fn join_with(
        options: &NatsOptions,
        runtime: Runtime,
        link: Arc<dyn Link>,
    ) -> Result<Arc<NatsWorld>> {
        let run = options.run.clone();
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            Error::runtime(format!("run '{run}': {what}: {e}"))
        };
        let signer = seal::Signer::new()?;
        let token = process_token(&signer);
        let own = join::Claim {
            token: token.clone(),
            key: signer.public_key(),
        };
        let run_id = wire::run_id(&run);
        let inbox = Arc::new(Inbox::new(run_id, options.ranks));
        let refusals = inbox.clone();
        let refused: Refused = Arc::new(move |why| refusals.server_refused(why));
        link.report_refusals(refused);
        let pumped = Arc::downgrade(&link);
        inbox.pump_with(inbox::Pump(Box::new(move |at_most| {
            pumped.upgrade().is_some_and(|link| link.pump(at_most))
        })));
        let common = format!("distopt.{run}.all");
        let (bucket, rank, tokens, tasks, admitted) = runtime.block_on(async {
            let link = &*link;
            let mut tasks = Vec::new();
            // A joining process hears the run's common subject from when it asks to be taken
            // in (`heal.rs`): until then its traffic is not this process's.
            let subjects = [format!("distopt.{run}.p.{token}"), common.clone()];
            for subject in &subjects[..if options.join { 1 } else { 2 }] {
                tasks.push(
                    listen(link, subject, &inbox)
                        .await
                        .map_err(|e| fail("cannot subscribe", &e))?,
                );
            }
            // The subscriptions are in place on the server before this process claims a rank.
            link.flush()
                .await
                .map_err(|e| fail("cannot reach the server", &e))?;
            let (bucket, rank, last) = if options.join {
                let bucket = join::running_bucket(link, &run).await?;
                let (k, rank) = NatsWorld::take_left_rank(&*bucket, &run, options, &own).await?;
                (bucket, rank, Some(k))
            } else {
                let bucket = join::open_bucket(link, &run).await?;
                let rank = join::claim(&*bucket, &run, options.ranks, options.rank, &own).await?;
                (bucket, rank, None)
            };
            inbox.set_rank(rank);
            let claims = join::claims(
                &*bucket,
                &run,
                options.ranks,
                options.join_timeout,
                (rank, &own),
            )
            .await;
            let keyed = claims.and_then(|claims| {
                let keys: Vec<String> = claims.iter().map(|c| c.key.clone()).collect();
                inbox.set_keys(seal::Keys::new(&run, &keys)?);
                Ok(claims.into_iter().map(|c| c.token).collect::<Vec<_>>())
            });
            let tokens = match keyed {
                Ok(tokens) => tokens,
                Err(e) => {
                    let _ = bucket.delete(&join::rank_key(rank)).await;
                    return Err(e);
                }
            };
            // A joining process asks to be taken in when its algorithm first agrees on a
            // membership (`heal.rs`), once it is ready to be healed.
            let admitted = last;
            inbox.all_heard();
            Ok::<_, Error>((bucket, rank, tokens, tasks, admitted))
        })?;

        let max_frame = link.max_payload().max(wire::HEADER_BYTES + 1024);
        let mut world = NatsWorld {
            rank,
            size: options.ranks,
            subjects: Mutex::new(
                tokens
                    .iter()
                    .map(|t| format!("distopt.{run}.p.{t}"))
                    .collect(),
            ),
            common,
            run,
            run_id,
            bound: options.failure_bound,
            max_frame,
            inbox,
            seq: Mutex::new(1),
            elastic: Mutex::new((0, vec![true; options.ranks])),
            beating: Arc::new(std::sync::atomic::AtomicBool::new(admitted.is_none())),
            joining_after: Mutex::new(admitted),
            join_timeout: options.join_timeout,
            changes: Mutex::new(Vec::new()),
            points: Mutex::new(0),
            heal: Mutex::new((0, std::collections::BTreeMap::new())),
            stats: StatsCounter::default(),
            scratch: Mutex::new(Vec::new()),
            received: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
            in_flight_buffers: Mutex::new(Vec::new()),
            background: Mutex::new(None),
            this: std::sync::Weak::new(),
            signer: Arc::new(signer),
            watch: Mutex::new(None),
            bucket,
            link,
            tasks: Mutex::new(tasks),
            runtime,
        };
        world.start_heartbeat()?;
        Ok(Arc::new_cyclic(|this| {
            world.this = this.clone();
            world
        }))
    }

    /// Tells the run that this process leaves it: the other ranks stop waiting for it half a
    /// second later (`inbox::LEAVING_GRACE`) instead of once it has been silent for the failure
    /// bound. A collective awaiting its frames then fails at once, and the next sync point of
    /// an elastic algorithm goes on without it. Dropping the world does this; call it first
    /// from a handler that ends the process without dropping it (an interrupted command). The
    /// statement is a frame sealed with this process's key, so no other client can make it,
    /// and it waits at most 2 s for a server that is gone. Only once: a second call, or one
    /// from a joining process not yet taken in (its key is not the rank's yet), says nothing.
    pub fn leave(&self) {
        let Some((_, frames)) = self.leaving_message() else {
            return;
        };
        if !self
            .beating
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        self.runtime
            .block_on_at_most(Duration::from_secs(2), async {
                for frame in frames {
                    let _ = self.link.publish(&self.common, Bytes::from(frame)).await;
                }
                let _ = self.link.flush().await;
            });
    }

    /// What [`leave`](Self::leave) publishes, for a caller that must say it from elsewhere:
    /// the subject (the run's common one) and the frames, sealed with this process's key. A
    /// browser page that is closing cannot wait for the thread this world blocks, so it keeps
    /// them and sends them over a connection of its own as it goes. `None` while this process
    /// may not speak for its rank (a joining process not yet taken in) or once it left. The
    /// frames hold no time or sequence: they say the same whenever they are sent, and only
    /// that this process leaves.
    pub fn leaving_message(&self) -> Option<(String, Vec<Vec<u8>>)> {
        if !self.beating.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let id = self.id(u64::MAX, KIND_LEAVING);
        let frames =
            wire::frames_sealed(&id, &[], self.max_frame, Vec::new, |d| self.signer.seal(d))
                .ok()?;
        Some((self.common.clone(), frames))
    }

    /// Publishes a heartbeat every [`HEARTBEAT`]: sealed, and numbered (its sequence number
    /// counts up) so that a recorded heartbeat played again cannot keep a dead rank alive.
    fn start_heartbeat(&mut self) -> Result<()> {
        let id = self.id(0, KIND_HEARTBEAT);
        let (max_frame, signer) = (self.max_frame, self.signer.clone());
        let beat = move |n: u64| {
            wire::frames_sealed(&MessageId { seq: n, ..id }, &[], max_frame, Vec::new, |d| {
                signer.seal(d)
            })
            .map(|mut frames| Bytes::from(frames.pop().unwrap_or_default()))
        };
        beat(1)?;
        let beating = self.beating.clone();
        let task = self.link.heartbeat(
            self.common.clone(),
            HEARTBEAT,
            Box::new(move |n| {
                beating
                    .load(std::sync::atomic::Ordering::Acquire)
                    .then(|| beat(n).ok())
                    .flatten()
            }),
        );
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
        Ok(())
    }

    /// [`Communicator::membership`], or (`again`) the membership agreed anew within the same
    /// sync point after a rank died during its mean (`commit.rs`).
    fn agree(&self, again: bool) -> Result<Membership> {
        self.agree_with(again, false)
    }

    /// [`NatsWorld::agree`]; with `defer_joiners`, the ranks it admits are not awaited by
    /// this process's collectives until [`NatsWorld::expect_joiners`] (a membership agreed in
    /// flight, whose joiners are healed when its means are applied).
    fn agree_with(&self, again: bool, defer_joiners: bool) -> Result<Membership> {
        let joining_after = self
            .joining_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(after) = joining_after {
            let admitted = self.admission(after)?;
            let next = NatsWorld::with_joining(&admitted);
            self.inbox.set_live(&next);
            *self.elastic.lock().unwrap_or_else(|e| e.into_inner()) = (admitted.epoch + 1, next);
            *self.heal.lock().unwrap_or_else(|e| e.into_inner()) =
                (admitted.epoch, std::collections::BTreeMap::new());
            return Ok(admitted);
        }
        let mut elastic = self.elastic.lock().unwrap_or_else(|e| e.into_inner());
        let (k, previous) = (elastic.0, elastic.1.clone());
        let mut watch = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let watched_before = watch.is_some();
        let agreed =
            self.runtime
                .block_on(self.agree_at(k, &previous, &mut watch, watched_before))?;
        drop(watch);
        self.conclude(&mut elastic, &previous, agreed, again, defer_joiners)
    }

    /// Sync point `k`'s live and joining ranks, `previous` being its last membership
    /// (`membership.rs`), woken by `watch` (opened here when there is none).
    async fn agree_at(
        &self,
        k: u64,
        previous: &[bool],
        watch: &mut Option<Box<dyn link::Watch>>,
        watched_before: bool,
    ) -> Result<(Vec<bool>, Vec<usize>)> {
        if watch.is_none() {
            // Wakes the agreement when the bucket changes; without it, it polls.
            *watch = self.bucket.watch("sync.>").await.ok();
        }
        let point = membership::Point {
            bucket: &*self.bucket,
            inbox: &self.inbox,
            signer: &self.signer,
            run: &self.run,
            rank: self.rank,
            bound: self.bound,
        };
        point
            .agree(k, previous, watch.as_mut(), watched_before)
            .await
    }

    /// Records the membership `agreed` at the sync point `elastic` is at (its last membership
    /// `previous`): the joiners it heals, the change of membership, and the next sync point.
    fn conclude(
        &self,
        elastic: &mut (u64, Vec<bool>),
        previous: &[bool],
        (live, joining): (Vec<bool>, Vec<usize>),
        again: bool,
        defer_joiners: bool,
    ) -> Result<Membership> {
        let k = elastic.0;
        self.rejoined(&joining)?;
        let agreed = Membership {
            epoch: k,
            live,
            joining,
        };
        let point = {
            let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
            if !again {
                *points += 1;
            }
            *points - 1
        };
        if agreed.live != previous || !agreed.joining.is_empty() {
            self.changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((
                    Membership {
                        epoch: point,
                        ..agreed.clone()
                    },
                    web_time::SystemTime::now(),
                ));
        }
        let next = NatsWorld::with_joining(&agreed);
        self.inbox
            .set_live(if defer_joiners { &agreed.live } else { &next });
        *elastic = (k + 1, next);
        *self.heal.lock().unwrap_or_else(|e| e.into_inner()) =
            (k, std::collections::BTreeMap::new());
        Ok(agreed)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The run's name.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// How many frames this process dropped because the rank they name did not seal them: a
    /// client of the run publishing in another rank's name. Nothing such a frame carries is
    /// used; a count above zero says someone tried.
    pub fn forged_frames(&self) -> u64 {
        self.inbox.forged()
    }

    /// The live ranks agreed at the last sync point (every rank before the first), without
    /// agreeing anew: for a display of who is training, or to record a run's membership.
    pub fn live(&self) -> Vec<bool> {
        self.elastic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// The sync points this process agreed on whose membership changed (ranks left, or
    /// joined after it), in order: a run's membership schedule, for a report or a replay.
    pub fn membership_changes(&self) -> Vec<Membership> {
        self.timed_membership_changes()
            .into_iter()
            .map(|(change, _)| change)
            .collect()
    }

    /// [`NatsWorld::membership_changes`], each with the time this process learnt the agreement
    /// (how long a run took to go on without a rank that died, or to take one in:
    /// `distopt bench recovery`).
    pub fn timed_membership_changes(&self) -> Vec<(Membership, web_time::SystemTime)> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Membership agreements so far ([`Communicator::membership`]'s calls, and one more for
    /// each sync point whose mean was discarded because a rank died during it).
    pub fn agreements(&self) -> u64 {
        self.elastic.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// How long a rank may be silent before a collective waiting on it fails.
    pub fn failure_bound(&self) -> Duration {
        self.bound
    }

    /// Waits until every rank has come here (an all-gather of nothing).
    ///
    /// # Errors
    /// Those of [`Communicator::all_gather_bytes`].
    pub fn barrier(&self) -> Result<()> {
        self.all_gather_bytes(vec![Vec::new()]).map(|_| ())
    }

    fn id(&self, seq: u64, kind: u8) -> MessageId {
        MessageId {
            run: self.run_id,
            epoch: 0,
            seq,
            from: self.rank as u32,
            kind,
        }
    }

    /// Starts the next collective: its sequence number.
    fn begin(&self) -> u64 {
        let mut next = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let seq = *next;
        *next += 1;
        self.inbox.advance(seq);
        seq
    }

    fn transport_error(&self, what: &str, e: &dyn std::fmt::Display) -> Error {
        Error::runtime(format!(
            "run '{}' rank {}: {what}: {e}",
            self.run, self.rank
        ))
    }

    /// Publishes message (`seq`, `kind`) with `payload` to `subject`, and sends it.
    fn send(&self, subject: &str, seq: u64, kind: u8, payload: &[u8]) -> Result<()> {
        let framer = wire::Framer::new(&self.id(seq, kind), payload, self.max_frame)?;
        let mut buffers: Vec<Vec<u8>> = {
            let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
            let keep = spare.len().saturating_sub(framer.chunks() as usize);
            spare.split_off(keep)
        };
        let mut frames = Vec::with_capacity(framer.chunks() as usize);
        // Each frame is published as soon as it is built: the client's task writes it to the
        // socket while this thread copies and seals the next.
        let sent = self.runtime.block_on(async {
            for chunk in 0..framer.chunks() {
                let buffer = buffers.pop().unwrap_or_default();
                let frame = Bytes::from(framer.frame(chunk, buffer, |d| self.signer.seal(d)));
                frames.push(frame.clone());
                self.link
                    .publish(subject, frame)
                    .await
                    .map_err(|e| self.transport_error("cannot publish", &e))?;
            }
            self.link
                .send_published()
                .await
                .map_err(|e| self.transport_error("cannot flush", &e))
        });
        // Flushed: the client has written the frames and let go of them, so their memory
        // serves the next send (a frame it still holds is simply not kept).
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        spare.append(&mut buffers);
        for frame in frames {
            if spare.len() < SPARE_FRAMES
                && let Ok(buffer) = frame.try_into_mut()
            {
                spare.push(buffer.into());
            }
        }
        sent
    }

    /// Message (`seq`, `kind`) of rank `from`, of `size` bytes when known.
    fn receive(&self, seq: u64, from: usize, kind: u8, size: Option<usize>) -> Result<Vec<u8>> {
        let id = MessageId {
            from: from as u32,
            ..self.id(seq, kind)
        };
        let assembler = match size {
            Some(size) => Assembler::new(id, size),
            None => Assembler::any_size(id),
        };
        self.inbox.receive(assembler, self.bound, &self.run)
    }

    /// Message (`seq`, `kind`) of rank `from`, assembled into `dest` (exactly its size).
    fn receive_into(&self, seq: u64, from: usize, kind: u8, dest: &mut [u8]) -> Result<()> {
        let id = MessageId {
            from: from as u32,
            ..self.id(seq, kind)
        };
        self.inbox
            .receive_into(Assembler::new(id, dest.len()), dest, self.bound, &self.run)
    }

    /// Every rank's part of gather `seq`, by rank: `mine` in this rank's place, the others'
    /// as they arrive.
    fn gathered(&self, seq: u64, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let mut mine = Some(mine);
        (0..self.size)
            .map(|rank| match mine.take_if(|_| rank == self.rank) {
                Some(mine) => Ok(mine),
                None => self.receive(seq, rank, KIND_GATHER, None),
            })
            .collect()
    }

    /// The elementwise sum over `members` (world ranks, in order) of each member's values,
    /// in place: `data` holds this rank's values on entry and the sums on exit, on every
    /// member. Each member owns a shard: it turns every member's value into its addend
    /// (`addend`: the mean's division, say — made by the owner, so the values travel as they
    /// are stored), adds them up in member order with every addition rounded to `arith`
    /// (`from_zero`: the sum starts at 0, else at the first member's addend), makes each sum
    /// its `result` (the division of a mean that divides the sum) and sends the shard's
    /// results to the others.
    #[allow(clippy::too_many_arguments)]
    fn reduce<T: Real + bytemuck::Pod>(
        &self,
        arith: StorageFormat,
        members: &[usize],
        data: &mut [T],
        from_zero: bool,
        addend: impl Fn(T) -> T,
        result: impl Fn(T) -> T,
    ) -> Result<()> {
        let seq = self.begin();
        let mut received = self.received.lock().unwrap_or_else(|e| e.into_inner());
        self.reduce_at(
            seq,
            &mut received,
            arith,
            members,
            data,
            from_zero,
            addend,
            result,
        )
    }

    /// [`NatsWorld::reduce`] as collective `seq`, assembling the contributions in `received`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_at<T: Real + bytemuck::Pod>(
        &self,
        seq: u64,
        received: &mut Vec<u64>,
        arith: StorageFormat,
        members: &[usize],
        data: &mut [T],
        from_zero: bool,
        addend: impl Fn(T) -> T,
        result: impl Fn(T) -> T,
    ) -> Result<()> {
        /// Elements summed at a time: this rank's own values of a block are copied aside
        /// (they are overwritten by the sums), small enough to stay in the L1 cache.
        const BLOCK: usize = 1024;
        let (m, n) = (members.len(), data.len());
        let me = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::runtime("a reduction over a group this rank is not in"))?;
        let shard = |k: usize| k * n / m..(k + 1) * n / m;
        let others = || members.iter().enumerate().filter(move |&(k, _)| k != me);
        for (k, &rank) in others() {
            let part: &[u8] = bytemuck::cast_slice(&data[shard(k)]);
            self.send(&self.subject(rank), seq, KIND_CONTRIBUTION, part)?;
        }
        let own = shard(me);
        let len = own.len();
        // The other members' values of the own shard, each assembled into its slot of one
        // buffer kept between collectives (aligned for T, so summed where they lie).
        let slots: &mut [T] = scratch_of(received, len * (m - 1));
        for (slot, (_, &rank)) in others().enumerate() {
            let dest = &mut slots[slot * len..(slot + 1) * len];
            self.receive_into(seq, rank, KIND_CONTRIBUTION, bytemuck::cast_slice_mut(dest))?;
        }
        let exact = rounds_to_itself::<T>(arith);
        let zero = T::scalar(0.0);
        let mut block = [zero; BLOCK];
        let sums = &mut data[own.clone()];
        for start in (0..len).step_by(BLOCK) {
            let end = (start + BLOCK).min(len);
            let sum = &mut sums[start..end];
            block[..sum.len()].copy_from_slice(sum);
            for k in 0..m {
                let values: &[T] = match k.cmp(&me) {
                    std::cmp::Ordering::Equal => &block[..sum.len()],
                    std::cmp::Ordering::Less => &slots[k * len + start..k * len + end],
                    std::cmp::Ordering::Greater => {
                        &slots[(k - 1) * len + start..(k - 1) * len + end]
                    }
                };
                if k == 0 {
                    for (s, &v) in sum.iter_mut().zip(values) {
                        *s = if from_zero {
                            T::round(arith, zero + addend(v))
                        } else {
                            addend(v)
                        };
                    }
                } else if exact {
                    for (s, &v) in sum.iter_mut().zip(values) {
                        *s = *s + addend(v);
                    }
                } else {
                    for (s, &v) in sum.iter_mut().zip(values) {
                        *s = T::round(arith, *s + addend(v));
                    }
                }
            }
            for s in sum.iter_mut() {
                *s = result(*s);
            }
        }
        for (_, &rank) in others() {
            let sums: &[u8] = bytemuck::cast_slice(&data[own.clone()]);
            self.send(&self.subject(rank), seq, KIND_RESULT, sums)?;
        }
        for (k, &rank) in others() {
            // Each owner's sums are assembled where they belong.
            let dest = bytemuck::cast_slice_mut::<T, u8>(&mut data[shard(k)]);
            self.receive_into(seq, rank, KIND_RESULT, dest)?;
        }
        Ok(())
    }

    /// Reduces the `runs` of this rank's arena over `members` (see [`NatsWorld::reduce`]):
    /// each element's `contribution` (made by this rank: DDP's scaling by its own scale; `None`
    /// sends the values as stored), its `addend` at the owner, the sums stored as `sum` says.
    /// One run of elements stored as `T` with no contribution to make is reduced where it
    /// lies in the arena; otherwise the values go to a scratch buffer kept between calls, are
    /// reduced there and stored back, or, with `Sum::Held`, left there for
    /// `NatsWorld::store_in` (`commit.rs`).
    #[allow(clippy::too_many_arguments)]
    fn reduce_arena<T: Real + bytemuck::Pod>(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        members: &[usize],
        runs: &[(Range<usize>, usize)],
        contribution: Option<impl Fn(T, usize) -> T>,
        addend: impl Fn(T) -> T,
        result: impl Fn(T) -> T,
        sum: Sum,
    ) -> Result<()> {
        let format = arena.format();
        let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
            // Nothing to reduce here, but the ranks still take part in the collective.
            return self.reduce::<T>(arith, members, &mut [], false, addend, result);
        };
        let span = first.0.start..last.0.end;
        let total: usize = runs.iter().map(|r| r.0.len()).sum();
        let natural = matches!(
            (format, std::mem::size_of::<T>()),
            (StorageFormat::F32, 4) | (StorageFormat::F64, 8)
        );
        let words_per = std::mem::size_of::<T>() / 4;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        transfer::with_row_words(arena, span, |words, base| {
            let place =
                |run: &Range<usize>| (run.start - base) * words_per..(run.end - base) * words_per;
            if let ([(run, _)], None, Sum::Stored, true) = (runs, &contribution, sum, natural)
                && let Ok(data) = bytemuck::try_cast_slice_mut::<u32, T>(&mut words[place(run)])
            {
                return self.reduce::<T>(arith, members, data, false, &addend, &result);
            }
            let data: &mut [T] = scratch_of(&mut scratch, total);
            let mut k = 0;
            for (run, param) in runs {
                let data = &mut data[k..k + run.len()];
                k += run.len();
                // Elements stored as T are read as a slice (a loop the compiler vectorizes).
                let values = natural
                    .then(|| bytemuck::try_cast_slice::<u32, T>(&words[place(run)]).ok())
                    .flatten();
                match (values, &contribution) {
                    (Some(values), None) => data.copy_from_slice(values),
                    (Some(values), Some(made)) => {
                        for (d, &x) in data.iter_mut().zip(values) {
                            *d = made(x, *param);
                        }
                    }
                    (None, made) => {
                        for (d, i) in data.iter_mut().zip(run.clone()) {
                            let x = T::load(format, words, i - base);
                            *d = made.as_ref().map_or(x, |c| c(x, *param));
                        }
                    }
                }
            }
            self.reduce::<T>(arith, members, data, false, &addend, &result)?;
            if sum == Sum::Stored {
                store_runs(format, words, base, runs, data);
            }
            Ok(())
        })
    }

    fn check_one_rank(&self, arena: &Arena, what: &str) -> Result<()> {
        one_rank::check_one_rank(arena, what, HOLDER)
    }

    fn check_root(&self, root: usize, what: &str) -> Result<()> {
        super::check_root(root, self.size, what)
    }

    fn record(&self, update: impl FnOnce(&mut CommStats)) {
        self.stats.record(update);
    }

    fn only<'a, T>(&self, per_local_rank: &'a [T]) -> Result<&'a T> {
        one_rank::only_rank(per_local_rank, HOLDER)
    }

    /// [`NatsWorld::reduce_arena`] of the mean over `members`: each value divided by their
    /// number and rounded to `arith`, the sum stored (`order`: or the values summed and the sum
    /// divided, as [`MeanOrder::SumThenDivide`] says).
    #[allow(clippy::too_many_arguments)]
    fn mean_arena<T: Real + bytemuck::Pod>(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        order: MeanOrder,
        members: &[usize],
        runs: &[(Range<usize>, usize)],
        sum: Sum,
    ) -> Result<()> {
        let divisor = T::scalar(members.len() as f64);
        // No contribution: the values travel as stored and each owner divides them.
        let none = None::<fn(T, usize) -> T>;
        let round = |x: T| T::round(arith, x);
        match (order, rounds_to_itself::<T>(arith)) {
            // The same quotients, in a loop free of the rounding's branch.
            (MeanOrder::DivideThenSum, true) => {
                let each = |x| x / divisor;
                self.reduce_arena::<T>(arena, arith, members, runs, none, each, |s| s, sum)
            }
            (MeanOrder::DivideThenSum, false) => {
                let each = |x| round(x / divisor);
                self.reduce_arena::<T>(arena, arith, members, runs, none, each, |s| s, sum)
            }
            (MeanOrder::SumThenDivide, _) => {
                let mean = |s| round(s / divisor);
                self.reduce_arena::<T>(arena, arith, members, runs, none, round, mean, sum)
            }
        }
    }

    /// [`NatsWorld::reduce_arena`] of DDP's scaled sum over the world: this rank's values of
    /// the parameters it has times `scale` (zeros without a scale or a gradient), the sum
    /// stored when this rank has a scale.
    fn scaled_sum_arena<T: Real + bytemuck::Pod>(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        runs: &[(Range<usize>, usize)],
        scale: Option<f64>,
        present: &[bool],
    ) -> Result<()> {
        let members: Vec<usize> = (0..self.size).collect();
        let zero = T::scalar(0.0);
        self.reduce_arena::<T>(
            arena,
            arith,
            &members,
            runs,
            Some(|x, j| match scale {
                Some(s) if present[j] => T::round(arith, x * T::scalar(s)),
                _ => zero,
            }),
            |x| x,
            |s| s,
            if scale.is_some() {
                Sum::Stored
            } else {
                Sum::Dropped
            },
        )
    }
}

impl Drop for NatsWorld {
    fn drop(&mut self) {
        self.leave();
        // The watch unsubscribes through the client's runtime (`native.rs`).
        drop(self.watch.lock().unwrap_or_else(|e| e.into_inner()).take());
        self.tasks.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let key = join::rank_key(self.rank);
        // Leave the run's name free for another run; never wait long on a server that is gone.
        // The delete is acknowledged by the server, after what `leave` published and flushed:
        // nothing is left to flush.
        self.runtime
            .block_on_at_most(Duration::from_secs(2), async {
                let _ = self.bucket.delete(&key).await;
            });
    }
}

/// Subscribes to `subject` through `link`, every message going into `inbox`: the task that
/// does it.
fn listen<'a>(
    link: &'a dyn Link,
    subject: &'a str,
    inbox: &Arc<Inbox>,
) -> Pending<'a, LinkResult<Task>> {
    let inbox = inbox.clone();
    link.subscribe(subject, Box::new(move |payload| inbox.push(payload)))
}

/// Whether rounding a `T` to `arith` leaves it as it is (float32 arithmetic computed in
/// `f32`, float64 in `f64`): the loops then skip the rounding's branch.
fn rounds_to_itself<T>(arith: StorageFormat) -> bool {
    matches!(
        (arith, std::mem::size_of::<T>()),
        (StorageFormat::F32 | StorageFormat::F64, 4) | (StorageFormat::F64, 8)
    )
}

/// Stores `values`, in run order, into the `runs` of a row's `words` (whose first element is
/// element `base`).
fn store_runs<T: Real>(
    format: StorageFormat,
    words: &mut [u32],
    base: usize,
    runs: &[(Range<usize>, usize)],
    values: &[T],
) {
    let mut k = 0;
    for (run, _) in runs {
        for i in run.clone() {
            T::store(format, words, i - base, values[k]);
            k += 1;
        }
    }
}

impl Communicator for NatsWorld {
    fn world_size(&self) -> usize {
        self.size
    }

    fn local_ranks(&self) -> Range<usize> {
        self.rank..self.rank + 1
    }

    fn all_reduce_mean(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        let live = vec![true; self.size];
        self.mean_over(arena, &live, mean, false)
    }

    /// Agrees with the other live processes on the ranks of the next sync point through the
    /// run's key-value bucket: the ranks of the last one that arrived, once every other one of
    /// them has been silent for the failure bound, and the processes that asked to join as
    /// ranks that left (`heal.rs`). Ranks that left are not waited for again. A process that
    /// joined gets the membership that admitted it, first.
    fn membership(&self) -> Result<Membership> {
        self.agree(false)
    }

    fn heal_rows(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        source: usize,
        joiner: usize,
    ) -> Result<()> {
        self.heal_arena(arena, source, joiner)
    }

    fn heal_bytes(&self, source: usize, joiner: usize, data: Vec<u8>) -> Result<Vec<u8>> {
        self.heal_data(source, joiner, data)
    }

    /// A sync point's mean, applied on every live rank or on none: a rank that dies during it
    /// makes the survivors agree on a new membership and average again over it (see
    /// `commit.rs`).
    fn all_reduce_mean_live(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        live: &[bool],
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<()> {
        self.mean_over(arena, live, mean, true)
    }

    /// The agreement runs on a background thread while the caller computes (`overlap.rs`).
    fn start_membership(&self) -> Result<InFlightMembership> {
        self.start_agreement()
    }

    fn progress_membership(&self, membership: &InFlightMembership) {
        self.progress_agreement(membership);
    }

    fn finish_membership(&self, membership: InFlightMembership) -> Result<Membership> {
        self.finish_agreement(membership)
    }

    /// The mean travels on a background thread, behind the agreement, while the caller
    /// computes (`overlap.rs`); it is committed as `all_reduce_mean_live`'s is.
    fn start_all_reduce_mean_in(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        membership: &InFlightMembership,
        mean: AllReduceMeanArgs<'_>,
    ) -> Result<InFlightMean> {
        self.start_mean(arena, membership, mean)
    }

    fn finish_all_reduce_mean_live(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        in_flight: InFlightMean,
    ) -> Result<()> {
        self.finish_mean(arena, in_flight)
    }

    fn all_reduce_scaled_sum(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        sum: AllReduceScaledSumArgs<'_>,
    ) -> Result<()> {
        self.check_one_rank(arena, "all_reduce")?;
        sum.check(arena)?;
        let runs = param_runs(sum.starts, sum.reduced, arena.rank_len());
        if sum.arith == StorageFormat::F64 {
            self.scaled_sum_arena::<f64>(arena, sum.arith, &runs, sum.scales[0], sum.present)?;
        } else {
            self.scaled_sum_arena::<f32>(arena, sum.arith, &runs, sum.scales[0], sum.present)?;
        }
        self.record(|s| s.add_all_reduce(self.size, sum.bytes_per_rank));
        Ok(())
    }

    fn broadcast(
        &self,
        _backend: &dyn Backend,
        arena: &mut Arena,
        root: usize,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        self.check_one_rank(arena, "broadcast")?;
        self.check_root(root, "broadcast")?;
        arena.check_range(0, offset, len)?;
        let seq = self.begin();
        let words = arena.format().words_for(len);
        if root == self.rank {
            let data = transfer::read_row_words(arena, 0, offset, len)?;
            self.send(
                &self.common,
                seq,
                KIND_BROADCAST,
                bytemuck::cast_slice(&data),
            )?;
        } else {
            let bytes = self.receive(seq, root, KIND_BROADCAST, Some(words * 4))?;
            arena.write(0, offset, &bytemuck::pod_collect_to_vec::<u8, u32>(&bytes))?;
        }
        let bytes = (len * arena.format().element_bytes()) as u64;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(())
    }

    fn broadcast_regions(
        &self,
        _backend: &dyn Backend,
        src: Option<&Arena>,
        dst: &mut Arena,
        root: usize,
        regions: &[BroadcastRegion],
    ) -> Result<()> {
        self.check_one_rank(dst, "broadcast")?;
        self.check_root(root, "broadcast")?;
        let bytes = regions::broadcast(src, dst, (root, self.rank), regions, |words| {
            let seq = self.begin();
            match words {
                Words::Send(words) => {
                    let payload = bytemuck::cast_slice(&words);
                    self.send(&self.common, seq, KIND_BROADCAST, payload)?;
                    Ok(words)
                }
                Words::Receive(len) => {
                    let bytes = self.receive(seq, root, KIND_BROADCAST, Some(len * 4))?;
                    Ok(bytemuck::pod_collect_to_vec(&bytes))
                }
            }
        })?;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(())
    }

    fn all_reduce_sum_f32(&self, per_local_rank: &[Vec<f32>]) -> Result<Vec<f32>> {
        let mine = self.only(per_local_rank)?;
        let members: Vec<usize> = (0..self.size).collect();
        let mut sum = mine.clone();
        self.reduce::<f32>(StorageFormat::F32, &members, &mut sum, true, |x| x, |s| s)?;
        let bytes = (mine.len() * 4) as u64;
        self.record(|s| s.add_all_reduce(self.size, bytes));
        Ok(sum)
    }

    fn broadcast_bytes(&self, root: usize, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
        self.check_root(root, "broadcast")?;
        let data = if root == self.rank {
            let data = super::root_data(root, data)?;
            let seq = self.begin();
            self.send(&self.common, seq, KIND_BROADCAST, &data)?;
            data
        } else {
            let seq = self.begin();
            self.receive(seq, root, KIND_BROADCAST, None)?
        };
        let bytes = data.len() as u64;
        self.record(|s| s.broadcast_bytes += bytes);
        Ok(data)
    }

    fn all_gather_bytes(&self, per_local_rank: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
        self.only(&per_local_rank)?;
        let mine = per_local_rank.into_iter().next().unwrap_or_default();
        let seq = self.begin();
        self.send(&self.common, seq, KIND_GATHER, &mine)?;
        let all = self.gathered(seq, mine)?;
        let bytes: usize = all.iter().map(Vec::len).sum();
        self.record(|s| s.gather_bytes += bytes as u64);
        Ok(all)
    }

    /// Waits for each rank until it has been silent for the failure bound (once: a rank that
    /// left is `None` at once in later gathers), or not at all for a rank outside the last
    /// agreed membership.
    fn all_gather_bytes_present(
        &self,
        per_local_rank: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        self.only(&per_local_rank)?;
        let mine = per_local_rank.into_iter().next().unwrap_or_default();
        let seq = self.begin();
        self.send(&self.common, seq, KIND_GATHER, &mine)?;
        let mut all = Vec::with_capacity(self.size);
        let mut mine = Some(mine);
        for rank in 0..self.size {
            if rank == self.rank {
                all.push(mine.take());
            } else {
                let id = MessageId {
                    from: rank as u32,
                    ..self.id(seq, KIND_GATHER)
                };
                all.push(self.inbox.receive_unless_gone(
                    Assembler::any_size(id),
                    self.bound,
                    &self.run,
                    true,
                )?);
            }
        }
        let bytes: usize = all.iter().flatten().map(Vec::len).sum();
        self.record(|s| s.gather_bytes += bytes as u64);
        Ok(all)
    }

    fn gather_bytes(
        &self,
        to: usize,
        per_local_rank: Vec<Vec<u8>>,
    ) -> Result<Option<Vec<Vec<u8>>>> {
        self.only(&per_local_rank)?;
        super::check_gather_root(to, self.size)?;
        let mine = per_local_rank.into_iter().next().unwrap_or_default();
        let seq = self.begin();
        if to != self.rank {
            self.send(&self.subject(to), seq, KIND_GATHER, &mine)?;
            self.record(|_| {});
            return Ok(None);
        }
        let all = self.gathered(seq, mine)?;
        let bytes = super::stats::gathered_to(&all, to);
        self.record(|s| s.gather_bytes += bytes);
        Ok(Some(all))
    }

    fn stats(&self) -> CommStats {
        self.stats.snapshot()
    }

    fn reset_stats(&self) {
        self.stats.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tls_ca_file_is_refused_before_connecting() {
        let mut options = NatsOptions::new("tls://127.0.0.1:1", "tls-ca", 2);
        options.tls_ca = Some("/nonexistent/ca.pem".into());
        let Err(e) = NatsWorld::join(&options) else {
            panic!("a missing CA file was accepted");
        };
        assert_eq!(e.kind(), crate::error::ErrorKind::ValueError);
        assert_eq!(
            e.message(),
            "run 'tls-ca': the TLS certificate authorities file /nonexistent/ca.pem does not exist"
        );
    }
}
