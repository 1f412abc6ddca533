//! What a [`NatsWorld`](super::NatsWorld) has received and not yet used: frames by message,
//! filled by the client's subscription tasks and drained by the collective awaiting them, and
//! when each rank was last heard from (its heartbeats and frames), which is how a rank that is
//! gone is noticed. Once the ranks' keys are known, a frame counts only when its sender sealed
//! it (`seal.rs`); before, frames are kept and checked when the keys arrive.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use web_time::Instant;

use bytes::Bytes;

use super::seal::Keys;
use crate::budget;
use crate::comm::wire::{Assembler, Frame, MessageId, WireError};
use crate::error::{Error, Result};

/// The kind of frame a rank publishes every [`HEARTBEAT`](super::HEARTBEAT) to say it is alive.
pub(super) const KIND_HEARTBEAT: u8 = 9;

/// The kind of frame a process publishes once as it leaves the run (its world dropped, its
/// command interrupted): sealed like a heartbeat, so that only the process that holds the
/// rank's key can say it (a process that takes the rank later has a key of its own).
pub(super) const KIND_LEAVING: u8 = 10;

/// How long after its leaving frame a rank counts as gone: its last frames may come on other
/// subjects than the leaving frame, and NATS orders a publisher's messages per subject only.
pub(super) const LEAVING_GRACE: Duration = Duration::from_millis(500);

/// Frames received, by message.
#[derive(Debug)]
struct State {
    /// Frames of messages not yet taken, by message.
    frames: HashMap<MessageId, Vec<Bytes>>,
    /// Bytes held in `frames` (checked against the memory budget before a frame is kept).
    held: usize,
    /// Collectives before this one are over: their frames are stale and dropped, but for
    /// those still `open`.
    floor: u64,
    /// Collectives below the floor still under way (a mean in flight, `overlap.rs`).
    open: std::collections::BTreeSet<u64>,
    /// When each rank was last heard from.
    heard: Vec<Instant>,
    /// The ranks of the current membership: only their silence ends a collective (a rank that
    /// left at a sync point is not waited for).
    live: Vec<bool>,
    /// Frames refused as they arrived (malformed, damaged, over the budget), with the last
    /// reason: the next collective fails with it.
    refused: Option<String>,
    /// Every rank's key, once the run is complete.
    keys: Option<Arc<Keys>>,
    /// The last heartbeat number heard from each rank (a heartbeat played again is ignored).
    beats: Vec<u64>,
    /// When each rank's process said it left ([`KIND_LEAVING`]): gone [`LEAVING_GRACE`]
    /// later, until another process takes the rank.
    left: Vec<Option<Instant>>,
    /// Frames dropped because their seal is not their sender's.
    forged: u64,
}

/// Received frames and liveness, shared by the subscription tasks and the collectives.
#[derive(Debug)]
pub(super) struct Inbox {
    run: u64,
    /// This process's rank once claimed (it does not hear its own heartbeats).
    me: std::sync::atomic::AtomicUsize,
    state: Mutex<State>,
    arrived: Condvar,
    /// Delivers the messages the link has received, on the waiting thread (a link whose
    /// client has no thread of its own to deliver them: [`Link::pump`](super::link::Link::pump)).
    pump: OnceLock<Pump>,
}

/// [`Inbox::pump_with`]'s function.
pub(super) struct Pump(pub Box<dyn Fn(Duration) -> bool + Send + Sync>);

impl std::fmt::Debug for Pump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pump")
    }
}

impl Inbox {
    pub(super) fn new(run: u64, ranks: usize) -> Inbox {
        Inbox {
            run,
            me: std::sync::atomic::AtomicUsize::new(usize::MAX),
            state: Mutex::new(State {
                frames: HashMap::new(),
                held: 0,
                floor: 0,
                open: std::collections::BTreeSet::new(),
                heard: vec![Instant::now(); ranks],
                live: vec![true; ranks],
                refused: None,
                keys: None,
                beats: vec![0; ranks],
                left: vec![None; ranks],
                forged: 0,
            }),
            arrived: Condvar::new(),
            pump: OnceLock::new(),
        }
    }

    /// Waits with `pump` (the link's [`Link::pump`](super::link::Link::pump)): when it
    /// delivers, a wait for frames calls it instead of waiting for another thread to push them.
    pub(super) fn pump_with(&self, pump: Pump) {
        let _ = self.pump.set(pump);
    }

    /// Delivers what the link has received so far, without waiting (a link that delivers on
    /// threads of its own: nothing to do).
    pub(super) fn drain(&self) {
        if let Some(pump) = self.pump.get() {
            (pump.0)(Duration::ZERO);
        }
    }

    /// Waits up to `at_most` for frames to arrive, `state`'s lock released meanwhile.
    fn await_frames<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        at_most: Duration,
    ) -> MutexGuard<'a, State> {
        if let Some(pump) = self.pump.get() {
            drop(state);
            if (pump.0)(at_most) {
                return self.lock();
            }
            let state = self.lock();
            return self
                .arrived
                .wait_timeout(state, at_most)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        self.arrived
            .wait_timeout(state, at_most)
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one received NATS payload: a frame of this run is kept for its collective (a
    /// heartbeat only marks its sender alive); another run's, an earlier collective's and a
    /// malformed frame are dropped, the last noted so that the awaiting collective can say why.
    /// A frame not sealed by the rank it names is dropped and counted, and marks nobody alive.
    pub(super) fn push(&self, bytes: Bytes) {
        let frame = match Frame::parse(&bytes) {
            Ok(frame) => frame,
            Err(e) => {
                self.lock().refused = Some(e.to_string());
                return;
            }
        };
        let id = frame.id;
        if id.run != self.run {
            return;
        }
        let from = id.from as usize;
        let keys = {
            let mut state = self.lock();
            if from >= state.heard.len() {
                state.refused = Some(format!("{id} names a rank outside the world"));
                return;
            }
            state.keys.clone()
        };
        // The seal is checked outside the lock (it hashes the frame); without keys yet, the
        // frame is kept and `set_keys` checks it.
        if let Some(keys) = keys
            && !keys.sealed_by_sender(&frame)
        {
            self.note_forged();
            return;
        }
        let mut state = self.lock();
        if id.kind == KIND_LEAVING {
            // Only with the keys can it be the rank's own word (it is then checked above).
            if state.keys.is_some() {
                state.left[from].get_or_insert_with(Instant::now);
                drop(state);
                self.arrived.notify_all();
            }
            return;
        }
        if id.kind == KIND_HEARTBEAT {
            // Before the keys, a heartbeat cannot be checked, and the time until the run is
            // complete is nobody's silence (`all_heard`): it is not counted.
            if state.keys.is_some() && id.seq > state.beats[from] {
                state.beats[from] = id.seq;
                state.heard[from] = Instant::now();
            }
            return;
        }
        if id.seq < state.floor && !state.open.contains(&id.seq) {
            return;
        }
        state.heard[from] = Instant::now();
        let held = state.held + bytes.len();
        if let Err(e) = budget::check(held, "frames received and not yet used") {
            state.refused = Some(e.message().to_string());
            return;
        }
        state.held = held;
        state.frames.entry(id).or_default().push(bytes);
        drop(state);
        self.arrived.notify_all();
    }

    /// Every rank's key: from now on a frame counts only when its sender sealed it, and the
    /// frames kept so far that it did not seal are dropped.
    pub(super) fn set_keys(&self, keys: Keys) {
        let mut state = self.lock();
        let mut forged = 0;
        let mut freed = 0;
        for frames in state.frames.values_mut() {
            frames.retain(|bytes| {
                let sealed = Frame::parse_header(bytes).is_ok_and(|f| keys.sealed_by_sender(&f));
                if !sealed {
                    forged += 1;
                    freed += bytes.len();
                }
                sealed
            });
        }
        state.frames.retain(|_, frames| !frames.is_empty());
        state.held -= freed;
        state.forged += forged;
        state.keys = Some(Arc::new(keys));
    }

    /// Rank `rank` is held by a new process (one that joined the run) with the key `keys` now
    /// hold for it: its heartbeats count from 1 again, and it counts as heard now.
    pub(super) fn rejoined(&self, rank: usize, keys: Keys) {
        let mut state = self.lock();
        state.keys = Some(Arc::new(keys));
        if let Some(beat) = state.beats.get_mut(rank) {
            *beat = 0;
        }
        if let Some(left) = state.left.get_mut(rank) {
            *left = None;
        }
        if let Some(heard) = state.heard.get_mut(rank) {
            *heard = Instant::now();
        }
    }

    /// How many frames (and membership statements) were dropped because the rank they name
    /// did not seal them.
    pub(super) fn forged(&self) -> u64 {
        self.lock().forged
    }

    /// A frame or membership statement in a rank's name was not sealed by it.
    pub(super) fn note_forged(&self) {
        self.lock().forged += 1;
    }

    /// Every rank's key, once the run is complete.
    pub(super) fn keys(&self) -> Option<Arc<Keys>> {
        self.lock().keys.clone()
    }

    /// This process holds rank `rank`.
    pub(super) fn set_rank(&self, rank: usize) {
        self.me.store(rank, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every rank counts as heard now: the run is complete, and the time spent waiting for the
    /// last rank to join is nobody's silence.
    pub(super) fn all_heard(&self) {
        let now = Instant::now();
        self.lock().heard.iter_mut().for_each(|h| *h = now);
    }

    /// Collectives before `seq` are over: their frames still held are dropped.
    pub(super) fn advance(&self, seq: u64) {
        let mut state = self.lock();
        state.floor = seq;
        let mut freed = 0;
        let open = std::mem::take(&mut state.open);
        state.frames.retain(|id, frames| {
            let keep = id.seq >= seq || open.contains(&id.seq);
            if !keep {
                freed += frames.iter().map(Bytes::len).sum::<usize>();
            }
            keep
        });
        state.held -= freed;
        state.open = open;
    }

    /// Collective `seq` stays under way while later ones begin: its frames are kept until
    /// [`Inbox::close`].
    pub(super) fn hold_open(&self, seq: u64) {
        self.lock().open.insert(seq);
    }

    /// Collective `seq`, held open, is over: its frames still held are dropped.
    pub(super) fn close(&self, seq: u64) {
        let mut state = self.lock();
        state.open.remove(&seq);
        if seq < state.floor {
            let mut freed = 0;
            state.frames.retain(|id, frames| {
                let keep = id.seq != seq;
                if !keep {
                    freed += frames.iter().map(Bytes::len).sum::<usize>();
                }
                keep
            });
            state.held -= freed;
        }
    }

    /// The server refused something this process did (`why`, its error): the next collective
    /// fails with it.
    pub(super) fn server_refused(&self, why: &str) {
        self.lock().refused = Some(format!("the server refused this process: {why}"));
        self.arrived.notify_all();
    }

    /// The ranks of the membership agreed at the last sync point.
    pub(super) fn set_live(&self, live: &[bool]) {
        self.lock().live = live.to_vec();
    }

    /// How long rank `rank` has been silent ([`Duration::MAX`] once its process said it left,
    /// [`LEAVING_GRACE`] ago).
    pub(super) fn silent_for(&self, rank: usize) -> Duration {
        self.drain();
        self.lock().silent_for(rank)
    }

    /// Message `id`, assembled by `assembler`, waiting for its frames until its sender has been
    /// silent for `bound`.
    ///
    /// # Errors
    /// A `RuntimeError` naming the rank when it fell silent for `bound` (it left, its connection
    /// dropped), or naming the frame when one of the message's frames is refused (another size,
    /// damaged, from a collective the sender should not be in), or a frame received meanwhile
    /// was malformed.
    pub(super) fn receive(
        &self,
        assembler: Assembler,
        bound: Duration,
        run_name: &str,
    ) -> Result<Vec<u8>> {
        let id = *assembler.expected();
        self.receive_unless_gone(assembler, bound, run_name, false)?
            .ok_or_else(|| Error::runtime(format!("run '{run_name}': {id} was never sent")))
    }

    /// [`Inbox::receive`], or with `tolerate_gone` `None` when the sender left instead of an
    /// error: it is outside the last agreed membership, or it has been silent for `bound`
    /// (other ranks' silence is then not this receive's business).
    ///
    /// # Errors
    /// Those of [`Inbox::receive`], less the sender's silence with `tolerate_gone`.
    pub(super) fn receive_unless_gone(
        &self,
        assembler: Assembler,
        bound: Duration,
        run_name: &str,
        tolerate_gone: bool,
    ) -> Result<Option<Vec<u8>>> {
        self.wait(assembler, None, bound, run_name, tolerate_gone)
    }

    /// [`Inbox::receive`] into `dest`, a buffer of exactly the message's size (see
    /// [`Assembler::accept_into`]): no buffer is allocated and no byte copied twice.
    ///
    /// # Errors
    /// Those of [`Inbox::receive`].
    pub(super) fn receive_into(
        &self,
        assembler: Assembler,
        dest: &mut [u8],
        bound: Duration,
        run_name: &str,
    ) -> Result<()> {
        let id = *assembler.expected();
        self.wait(assembler, Some(dest), bound, run_name, false)?
            .map(|_| ())
            .ok_or_else(|| Error::runtime(format!("run '{run_name}': {id} was never sent")))
    }

    /// Waits for the message `assembler` awaits, assembled into `dest` when given (then
    /// `Some` of an empty vector when complete), else into a buffer of its own.
    fn wait(
        &self,
        mut assembler: Assembler,
        mut dest: Option<&mut [u8]>,
        bound: Duration,
        run_name: &str,
        tolerate_gone: bool,
    ) -> Result<Option<Vec<u8>>> {
        let id = *assembler.expected();
        let me = self.me.load(std::sync::atomic::Ordering::Relaxed);
        // What arrived while this thread computed counts before anyone's silence does.
        self.drain();
        let mut state = self.lock();
        loop {
            if let Some(why) = state.refused.take() {
                return Err(Error::runtime(format!(
                    "run '{run_name}': a frame was refused while {id} was awaited: {why}"
                )));
            }
            if let Some(frames) = state.frames.remove(&id) {
                state.held -= frames.iter().map(Bytes::len).sum::<usize>();
                for bytes in frames {
                    // Checked as it arrived (`push`: its sizes and its seal): not parsed again.
                    let frame = Frame::parse_header(&bytes).map_err(Error::from)?;
                    let accepted = match dest.as_deref_mut() {
                        Some(dest) => assembler
                            .accept_into(&frame, dest)
                            .map(|done| done.then(Vec::new)),
                        None => assembler.accept(&frame),
                    };
                    match accepted {
                        Ok(Some(message)) => return Ok(Some(message)),
                        Ok(None) => {}
                        Err(e) if e.is_stale() => {}
                        Err(e) => return Err(refused(run_name, &e)),
                    }
                }
            }
            // Any live rank silent past the bound ends the run for every survivor at once (the
            // one awaited first): a survivor that waits on another survivor does not wait for
            // that one to notice first. A rank that left at a sync point is not live.
            let awaited = id.from as usize;
            if tolerate_gone {
                let left = !state.live.get(awaited).copied().unwrap_or(false)
                    || state.silent_for(awaited) > bound;
                if left {
                    return Ok(None);
                }
                state = self.await_frames(state, Duration::from_millis(50));
                continue;
            }
            // The awaited rank's process may have said it left; another rank that did so may
            // simply have finished first, and counts as gone only once silent for the bound.
            if awaited != me && state.has_left(awaited) {
                return Err(Error::runtime(format!(
                    "run '{run_name}': rank {awaited} left the run while {id} was awaited"
                )));
            }
            let gone = std::iter::once(awaited)
                .chain((0..state.heard.len()).filter(|&r| state.live[r]))
                .find(|&r| r != me && state.heard[r].elapsed() > bound);
            if let Some(rank) = gone {
                return Err(Error::runtime(format!(
                    "run '{run_name}': rank {rank} is gone: nothing heard from it for {:.1} s (the bound is {:.1} s) while {id} was awaited",
                    state.heard[rank].elapsed().as_secs_f64(),
                    bound.as_secs_f64()
                )));
            }
            state = self.await_frames(state, Duration::from_millis(50));
        }
    }
}

impl State {
    /// Whether `rank`'s process said it left, [`LEAVING_GRACE`] ago or more.
    fn has_left(&self, rank: usize) -> bool {
        self.left
            .get(rank)
            .copied()
            .flatten()
            .is_some_and(|at| at.elapsed() >= LEAVING_GRACE)
    }

    /// How long `rank` has been silent ([`Duration::MAX`] once it has left, or for a rank
    /// outside the world).
    fn silent_for(&self, rank: usize) -> Duration {
        if self.has_left(rank) {
            return Duration::MAX;
        }
        self.heard.get(rank).map_or(Duration::MAX, Instant::elapsed)
    }
}

fn refused(run_name: &str, e: &WireError) -> Error {
    Error::runtime(format!("run '{run_name}': a frame was refused: {e}"))
}
