//! The messaging system as the networked world's protocol sees it: publish and subscribe on
//! subjects, and the run's key-value bucket (rank claims, sync points, requests to join).
//!
//! The protocol (`join.rs`, `membership.rs`, `heal.rs` and the collectives of `mod.rs`) speaks
//! only to these traits, so that it is one protocol whatever client carries it: natively
//! async-nats on a tokio runtime (`native.rs`); the traits are shaped for a JavaScript client
//! (nats.js, over WebSocket) too — every operation a future, timers included, and nothing that
//! names a runtime. Every future is boxed, so that the traits are object safe, and `Send`.
//!
//! A link whose client cannot deliver messages on a thread of its own (the npm package's
//! nats.js port, whose client runs in a worker while the rank's thread blocks) delivers them
//! when the protocol waits: [`Link::pump`].
//!
//! [`NatsWorld::join_over`](super::NatsWorld::join_over) joins a run over any link.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use web_time::Instant;

use bytes::Bytes;

/// A future of the link.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

thread_local! {
    static BETWEEN_STEPS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the protocol is being polled between the caller's steps rather than waited for: a
/// link that answers every operation before its future is polled (the wasm port) then makes
/// its waits — [`Watch::next_before`], [`Bucket::pause`] — pending until they are due, and its
/// key-value calls pending until answered, instead of blocking the thread, so that a sync
/// point in flight moves on while the caller computes.
pub fn polled_between_steps() -> bool {
    BETWEEN_STEPS.with(std::cell::Cell::get)
}

/// Polls `future` once, as [`polled_between_steps`] describes.
pub(crate) fn poll_between_steps<F: Future + ?Sized>(
    future: Pin<&mut F>,
) -> std::task::Poll<F::Output> {
    BETWEEN_STEPS.with(|flag| flag.set(true));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let polled = future.poll(&mut context);
    BETWEEN_STEPS.with(|flag| flag.set(false));
    polled
}

/// An operation of the link that failed, in the client's words (they end up in the named
/// errors of the collective or the join that needed it).
#[derive(Debug, Clone)]
pub struct LinkError(pub String);

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl LinkError {
    /// The error `e` of the client, by its text.
    pub fn of(e: impl std::fmt::Display) -> LinkError {
        LinkError(e.to_string())
    }
}

/// What an operation of the link gives.
pub type LinkResult<T> = std::result::Result<T, LinkError>;

/// Something the link keeps doing in the background (delivering a subscription's messages,
/// publishing heartbeats), until it is dropped.
pub struct Task(Option<Box<dyn FnOnce() + Send + Sync>>);

impl Task {
    /// A task that `stop` ends.
    pub fn new(stop: impl FnOnce() + Send + Sync + 'static) -> Task {
        Task(Some(Box::new(stop)))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(stop) = self.0.take() {
            stop();
        }
    }
}

/// What a subscription does with each message it receives: its payload.
pub type Deliver = Box<dyn Fn(Bytes) + Send + Sync>;

/// A heartbeat's `n`-th message, `None` to skip it (the rank is not beating yet).
pub type Beat = Box<dyn Fn(u64) -> Option<Bytes> + Send + Sync>;

/// Where a link reports what the server refused this process (a publish or a subscription
/// its permissions deny), in the server's words: the collective awaiting it then fails naming
/// it instead of waiting for the failure bound.
pub type Refused = Arc<dyn Fn(&str) + Send + Sync>;

/// A connection to the messaging system.
pub trait Link: Send + Sync {
    /// The largest payload the server takes in one message.
    fn max_payload(&self) -> usize;

    /// Publishes `payload` on `subject` (buffered: [`Link::flush`] sends it).
    fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> Pending<'a, LinkResult<()>>;

    /// Sends everything published so far, and waits until the server has it.
    fn flush(&self) -> Pending<'_, LinkResult<()>>;

    /// Sends everything published so far, without waiting for the server: a collective's
    /// frames, whose receivers wait for them (a connection that fails meanwhile ends the
    /// collective through [`Link::pump`] or the failure bound). By default [`Link::flush`]; a
    /// link whose flush is a round trip to the server (nats.js's is a PING answered by a PONG)
    /// hands the frames to its client and returns.
    fn send_published(&self) -> Pending<'_, LinkResult<()>> {
        self.flush()
    }

    /// Subscribes to `subject`: from when the future is ready (the server has the
    /// subscription only once [`Link::flush`] returns), every message's payload goes to
    /// `deliver`, until the task is dropped.
    fn subscribe<'a>(&'a self, subject: &'a str, deliver: Deliver)
    -> Pending<'a, LinkResult<Task>>;

    /// Publishes `beat(1)`, `beat(2)`, … on `subject`, one every `period`, each flushed, until
    /// the task is dropped.
    fn heartbeat(&self, subject: String, period: Duration, beat: Beat) -> Task;

    /// Opens key-value bucket `name`; with `create`, creates it (in memory, one revision per
    /// key) when it does not exist. Its error says why it cannot be opened.
    fn bucket<'a>(
        &'a self,
        name: &'a str,
        create: bool,
    ) -> Pending<'a, LinkResult<Box<dyn Bucket>>>;

    /// From now on, tells `refused` what the server refuses this process (see [`Refused`]).
    fn report_refusals(&self, refused: Refused);

    /// Delivers, on the calling thread, the messages received so far to their
    /// subscriptions' [`Deliver`]s, waiting up to `at_most` for the first: `true`. A link
    /// whose client delivers on threads of its own (the native one, the default) returns
    /// `false` at once, and the caller waits for the deliveries instead.
    fn pump(&self, at_most: Duration) -> bool {
        let _ = at_most;
        false
    }
}

/// A key's last revision as a bucket holds it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The value put (empty when deleted).
    pub value: Bytes,
    /// Whether the last revision deleted or purged the key.
    pub deleted: bool,
}

/// One change of a watched key.
#[derive(Debug, Clone)]
pub struct Update {
    /// The key.
    pub key: String,
    /// Its new value; `None` when it was deleted or purged.
    pub value: Option<Bytes>,
}

/// What waiting on a [`Watch`] gave.
#[derive(Debug)]
pub enum Watched {
    /// A key changed.
    Update(Update),
    /// Nothing changed before the deadline.
    Quiet,
    /// The watch ended or failed: it gives nothing more.
    Ended,
}

/// A key-value bucket of the server (JetStream KV): the run's rendezvous.
pub trait Bucket: Send + Sync {
    /// `key`'s value, `None` when it has none (never put, or deleted).
    fn get<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Bytes>>>;

    /// `key`'s last revision, deleted or not; `None` when it was never put.
    fn entry<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Entry>>>;

    /// Puts `value` as `key`'s value.
    fn put<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>>;

    /// Puts `value` as `key`'s value unless the key has one: the server's atomic create, of
    /// which exactly one of several racing callers succeeds. An error when it has one.
    fn create<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>>;

    /// Deletes `key`.
    fn delete<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<()>>;

    /// Deletes `key`, a key no longer needed, its failure ignored. By default it waits for the
    /// delete; a link may instead queue it (the wasm link's port: its later calls see it done)
    /// so that the caller's step does not wait on a round trip for a clean-up.
    fn discard<'a>(&'a self, key: &'a str) -> Pending<'a, ()> {
        Box::pin(async move {
            let _ = self.delete(key).await;
        })
    }

    /// Watches the keys matching `pattern` (`sync.>`) for changes from now on.
    fn watch<'a>(&'a self, pattern: &'a str) -> Pending<'a, LinkResult<Box<dyn Watch>>>;

    /// Waits `duration` before the bucket is read again (the client's timer).
    fn pause(&self, duration: Duration) -> Pending<'static, ()>;
}

/// The changes of a bucket's watched keys, in the order the server made them.
pub trait Watch: Send {
    /// The next change, waiting until `deadline` at the most.
    fn next_before(&mut self, deadline: Instant) -> Pending<'_, Watched>;

    /// The next change already received, without waiting (`None`: none is there, or the
    /// watch ended).
    fn ready(&mut self) -> Option<Update>;
}
