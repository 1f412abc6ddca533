//! The networked world's [`Link`] in wasm: the npm package's nats.js port
//! (`npm/nats/port.js`), whose client runs in a worker thread while this thread blocks in the
//! port's synchronous calls (`Atomics.wait`: Node's main thread or any Worker may block; a
//! browser page's main thread may not).
//!
//! Every operation is done when its future is made (a key-value call: when it is first
//! polled), so the protocol's futures are ready when first polled — except while a sync point
//! in flight is polled between the caller's steps (`link::polled_between_steps`): its waits (a
//! watch's next change, a pause) are then pending until due, and its key-value calls are
//! started in the port and pending until the port's worker has served them, so that Streaming
//! DiLoCo's agreement moves on while the rank computes.
//! Messages of the subscriptions wait in the port until the protocol waits for
//! them ([`Link::pump`]), and are delivered then, on this thread. The heartbeat's frames are
//! sealed here, ahead of time, and handed to the port, which publishes one every period while
//! this thread computes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use web_time::Instant;

use distopt::comm::NatsOptions;
use distopt::comm::nats::link::{
    Beat, Bucket, Deliver, Entry, Link, LinkError, LinkResult, Pending, Refused, Task, Update,
    Watch, Watched, polled_between_steps,
};

#[wasm_bindgen]
extern "C" {
    /// A connection to a NATS server whose calls block until done (`openPort`,
    /// npm/nats/port.js).
    #[wasm_bindgen(typescript_type = "Port")]
    pub type Port;

    #[wasm_bindgen(method, getter, js_name = maxPayload)]
    fn max_payload(this: &Port) -> f64;
    #[wasm_bindgen(method, catch)]
    fn publish(this: &Port, subject: &str, data: &[u8]) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn flush(this: &Port) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn subscribe(this: &Port, sid: u32, subject: &str) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn unsubscribe(this: &Port, sid: u32) -> Result<(), JsValue>;
    /// `pump` whose payloads are views of the port's answer area, valid until its next call
    /// that answers.
    #[wasm_bindgen(method, catch, js_name = pumpViews)]
    fn pump_views(this: &Port, timeout_ms: f64) -> Result<js_sys::Array, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn heartbeat(this: &Port, hid: u32, subject: &str, period_ms: f64) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn beats(this: &Port, hid: u32, frames: js_sys::Array) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = stopHeartbeat)]
    fn stop_heartbeat(this: &Port, hid: u32) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvOpen)]
    fn kv_open(this: &Port, bucket: &str, create: bool) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvGet)]
    fn kv_get(this: &Port, bucket: &str, key: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvEntry)]
    fn kv_entry(this: &Port, bucket: &str, key: &str) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvPut)]
    fn kv_put(this: &Port, bucket: &str, key: &str, value: &[u8]) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvCreate)]
    fn kv_create(this: &Port, bucket: &str, key: &str, value: &[u8]) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvDelete)]
    fn kv_delete(this: &Port, bucket: &str, key: &str) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn start(this: &Port, op: &str, bucket: &str, key: &str, value: &[u8]) -> Result<u32, JsValue>;
    #[wasm_bindgen(method)]
    fn served(this: &Port, ticket: u32) -> bool;
    #[wasm_bindgen(method, catch)]
    fn result(this: &Port, ticket: u32) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn forget(this: &Port, ticket: u32) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvDiscard)]
    fn kv_discard(this: &Port, bucket: &str, key: &str) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = kvWatch)]
    fn kv_watch(this: &Port, wid: u32, bucket: &str, pattern: &str) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch, js_name = watchNext)]
    fn watch_next(this: &Port, wid: u32, timeout_ms: f64) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch, js_name = watchReady)]
    fn watch_ready(this: &Port, wid: u32) -> Result<JsValue, JsValue>;
    #[wasm_bindgen(method, catch)]
    fn unwatch(this: &Port, wid: u32) -> Result<(), JsValue>;
    #[wasm_bindgen(method, catch)]
    fn sleep(this: &Port, ms: f64) -> Result<(), JsValue>;
}

/// The port, shared by the link, its buckets and watches.
///
/// The module is built without threads (the networked world is not offered in the threaded
/// build, `World.joinNats`): this thread is the only one, so the port may be held where the
/// protocol's traits ask for `Send` and `Sync`.
#[derive(Clone)]
struct Shared(Arc<Port>);

// SAFETY: this module exists only in a build without atomics, where there is one thread.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

/// A JS exception as a link error: an `Error`'s message, or the value's text.
fn link_error(e: JsValue) -> LinkError {
    let message = e
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| e.as_string())
        .unwrap_or_else(|| format!("{e:?}"));
    LinkError(message)
}

fn done<'a, T: Send + 'a>(result: LinkResult<T>) -> Pending<'a, LinkResult<T>> {
    Box::pin(std::future::ready(result))
}

/// A heartbeat's frames, sealed ahead and handed to the port.
struct Heartbeat {
    beat: Beat,
    /// The next frame's number.
    next: u64,
    /// When the frames handed to the port run out.
    covered_until: Instant,
    period: Duration,
}

/// How far ahead a heartbeat's frames are made, and how much is left when more are made.
const BEATS_AHEAD: Duration = Duration::from_secs(120);
const BEATS_LOW: Duration = Duration::from_secs(60);

/// What the link keeps between calls.
#[derive(Default)]
struct State {
    next_id: u32,
    subscriptions: HashMap<u32, Arc<Deliver>>,
    heartbeats: HashMap<u32, Heartbeat>,
}

/// A fresh id of a subscription, heartbeat or watch of the link.
fn next_id(state: &Mutex<State>) -> u32 {
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    state.next_id += 1;
    state.next_id
}

/// The link over a [`Port`].
pub(crate) struct PortLink {
    port: Shared,
    state: Arc<Mutex<State>>,
    refused: OnceLock<Refused>,
}

thread_local! {
    /// The ports a live link uses: one world per port, since a port's deliveries go to
    /// whichever link pumps them.
    static IN_USE: std::cell::RefCell<Vec<JsValue>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for PortLink {
    fn drop(&mut self) {
        let port: &JsValue = &self.port.0;
        IN_USE.with(|used| used.borrow_mut().retain(|p| !js_sys::Object::is(p, port)));
    }
}

impl PortLink {
    /// The link over `port`, which must be a port (`openPort`'s, or an object with its
    /// methods): a `TypeError` otherwise.
    pub(crate) fn new(port: JsValue) -> distopt::error::Result<PortLink> {
        let is_port = port.is_object()
            && ["pump", "publish", "flush", "kvOpen"].iter().all(|method| {
                js_sys::Reflect::get(&port, &JsValue::from_str(method))
                    .is_ok_and(|f| f.is_function())
            });
        if !is_port {
            return Err(distopt::error::Error::type_error(
                "port must be a Port (await openPort({servers}) from distopt/nats)",
            ));
        }
        let taken = IN_USE.with(|used| {
            let mut used = used.borrow_mut();
            let taken = used.iter().any(|p| js_sys::Object::is(p, &port));
            if !taken {
                used.push(port.clone());
            }
            taken
        });
        if taken {
            return Err(distopt::error::Error::value(
                "this port already serves a World (one world per port: open another port, or free that world first)",
            ));
        }
        Ok(PortLink {
            port: Shared(Arc::new(port.unchecked_into())),
            state: Arc::default(),
            refused: OnceLock::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn id(&self) -> u32 {
        next_id(&self.state)
    }

    /// A task whose end runs `forget` on the link's state (the id's entry) and `stop` on the
    /// port.
    fn task(
        &self,
        forget: impl FnOnce(&mut State) + Send + Sync + 'static,
        stop: impl FnOnce(&Port) + Send + Sync + 'static,
    ) -> Task {
        let (port, state) = (self.port.clone(), self.state.clone());
        Task::new(move || {
            forget(&mut state.lock().unwrap_or_else(|e| e.into_inner()));
            stop(&port.0);
        })
    }

    /// Hands every heartbeat more frames when what the port holds runs low.
    fn refill(&self) {
        let now = Instant::now();
        let mut state = self.lock();
        for (&hid, heartbeat) in &mut state.heartbeats {
            if heartbeat.covered_until > now + BEATS_LOW {
                continue;
            }
            let from = heartbeat.covered_until.max(now);
            let count = (BEATS_AHEAD.as_secs_f64() / heartbeat.period.as_secs_f64()).ceil() as u64;
            let frames = js_sys::Array::new();
            for _ in 0..count {
                // Not beating yet (a joining process before it is healed): try again later.
                let Some(frame) = (heartbeat.beat)(heartbeat.next) else {
                    break;
                };
                frames.push(&js_sys::Uint8Array::from(&frame[..]));
                heartbeat.next += 1;
            }
            if frames.length() > 0 && self.port.0.beats(hid, frames.clone()).is_ok() {
                heartbeat.covered_until = from + heartbeat.period * frames.length();
            }
        }
    }
}

impl Link for PortLink {
    fn max_payload(&self) -> usize {
        self.port.0.max_payload() as usize
    }

    fn publish<'a>(&'a self, subject: &'a str, payload: Bytes) -> Pending<'a, LinkResult<()>> {
        done(self.port.0.publish(subject, &payload).map_err(link_error))
    }

    fn flush(&self) -> Pending<'_, LinkResult<()>> {
        self.refill();
        done(self.port.0.flush().map_err(link_error))
    }

    /// The port's worker publishes each frame as it gets it: no round trip to the server (the
    /// port's flush is one), and a connection that failed shows at the next pump.
    fn send_published(&self) -> Pending<'_, LinkResult<()>> {
        self.refill();
        done(Ok(()))
    }

    fn subscribe<'a>(
        &'a self,
        subject: &'a str,
        deliver: Deliver,
    ) -> Pending<'a, LinkResult<Task>> {
        let sid = self.id();
        if let Err(e) = self.port.0.subscribe(sid, subject) {
            return done(Err(link_error(e)));
        }
        self.lock().subscriptions.insert(sid, Arc::new(deliver));
        done(Ok(self.task(
            move |state| drop(state.subscriptions.remove(&sid)),
            move |port| drop(port.unsubscribe(sid)),
        )))
    }

    fn heartbeat(&self, subject: String, period: Duration, beat: Beat) -> Task {
        let hid = self.id();
        let _ = self
            .port
            .0
            .heartbeat(hid, &subject, period.as_secs_f64() * 1e3);
        self.lock().heartbeats.insert(
            hid,
            Heartbeat {
                beat,
                next: 1,
                covered_until: Instant::now(),
                period,
            },
        );
        self.refill();
        self.task(
            move |state| drop(state.heartbeats.remove(&hid)),
            move |port| drop(port.stop_heartbeat(hid)),
        )
    }

    fn bucket<'a>(
        &'a self,
        name: &'a str,
        create: bool,
    ) -> Pending<'a, LinkResult<Box<dyn Bucket>>> {
        let opened = self.port.0.kv_open(name, create).map_err(link_error);
        done(opened.map(|()| {
            Box::new(PortBucket {
                port: self.port.clone(),
                name: name.to_string(),
                state: self.state.clone(),
            }) as Box<dyn Bucket>
        }))
    }

    fn report_refusals(&self, refused: Refused) {
        let _ = self.refused.set(refused);
    }

    fn pump(&self, at_most: Duration) -> bool {
        self.refill();
        let Ok(delivered) = self.port.0.pump_views(at_most.as_secs_f64() * 1e3) else {
            // The connection is gone: nothing more arrives, and the ranks' silence ends the
            // collective waiting on them (named) within the failure bound; no busy wait meanwhile.
            let _ = self.port.0.sleep(at_most.as_secs_f64() * 1e3);
            return true;
        };
        // Every payload is copied out of the port's answer area before anything is delivered
        // (a delivery may call the port, whose next answer overwrites the area).
        let delivered: Vec<(u32, Vec<u8>)> = delivered
            .iter()
            .map(|pair| {
                let pair: js_sys::Array = pair.unchecked_into();
                let sid = pair.get(0).as_f64().unwrap_or(0.0) as u32;
                (sid, copied(&pair.get(1).unchecked_into()))
            })
            .collect();
        for (sid, payload) in delivered {
            if sid == 0 {
                if let Some(report) = self.refused.get() {
                    report(&String::from_utf8_lossy(&payload));
                }
                continue;
            }
            let deliver = self.lock().subscriptions.get(&sid).cloned();
            if let Some(deliver) = deliver {
                deliver(Bytes::from(payload));
            }
        }
        true
    }
}

/// A bucket through the port.
struct PortBucket {
    port: Shared,
    name: String,
    state: Arc<Mutex<State>>,
}

/// A `Uint8Array` (or `null`) answered by the port.
fn optional_bytes(value: &JsValue) -> Option<Bytes> {
    (!value.is_null() && !value.is_undefined()).then(|| Bytes::from(copied(value.unchecked_ref())))
}

/// The bytes of `array` in memory of the module's own: one copy, no zeroing first.
fn copied(array: &js_sys::Uint8Array) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(array.length() as usize);
    let len = array.copy_to_uninit(bytes.spare_capacity_mut()).len();
    // SAFETY: `copy_to_uninit` initialized the first `len` bytes of the spare capacity.
    unsafe { bytes.set_len(len) };
    bytes
}

/// Field `key` of an object the port answered.
fn field(value: &JsValue, key: &str) -> JsValue {
    js_sys::Reflect::get(value, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// A watch's `{key, value}` as an update.
fn update(value: &JsValue) -> Update {
    Update {
        key: field(value, "key").as_string().unwrap_or_default(),
        value: optional_bytes(&field(value, "value")),
    }
}

/// A key-value call of the port (`kvGet`, `kvEntry`, `kvPut`, `kvCreate`).
#[derive(Clone, Copy)]
enum KvCall {
    Get,
    Entry,
    Put,
    Create,
}

impl KvCall {
    fn name(self) -> &'static str {
        match self {
            KvCall::Get => "kvGet",
            KvCall::Entry => "kvEntry",
            KvCall::Put => "kvPut",
            KvCall::Create => "kvCreate",
        }
    }

    /// The call, waiting for its answer in the port.
    fn call(self, port: &Port, bucket: &str, key: &str, value: &[u8]) -> Result<JsValue, JsValue> {
        match self {
            KvCall::Get => port.kv_get(bucket, key),
            KvCall::Entry => port.kv_entry(bucket, key),
            KvCall::Put => port.kv_put(bucket, key, value).map(|()| JsValue::UNDEFINED),
            KvCall::Create => port
                .kv_create(bucket, key, value)
                .map(|()| JsValue::UNDEFINED),
        }
    }
}

/// A key-value call as a future. Polled between the caller's steps it is started in the port
/// (`Port.start`) and pending until the port's worker has served it, so that the steps go on
/// during its round trip to the server; waited for, it waits in the port like every other call.
struct KvFuture<T> {
    port: Shared,
    call: KvCall,
    bucket: String,
    key: String,
    value: Bytes,
    /// The ticket of the call once started.
    ticket: Option<u32>,
    answer: fn(JsValue) -> T,
}

impl<T> Future for KvFuture<T> {
    type Output = LinkResult<T>;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<LinkResult<T>> {
        let this = &mut *self;
        let port = &this.port.0;
        let answered = match this.ticket {
            None if !polled_between_steps() => {
                this.call.call(port, &this.bucket, &this.key, &this.value)
            }
            None => {
                match port.start(this.call.name(), &this.bucket, &this.key, &this.value) {
                    Ok(ticket) => this.ticket = Some(ticket),
                    Err(e) => return Poll::Ready(Err(link_error(e))),
                }
                return Poll::Pending;
            }
            Some(ticket) if polled_between_steps() && !port.served(ticket) => {
                return Poll::Pending;
            }
            Some(ticket) => {
                this.ticket = None;
                port.result(ticket)
            }
        };
        Poll::Ready(answered.map(this.answer).map_err(link_error))
    }
}

impl<T> Drop for KvFuture<T> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            let _ = self.port.0.forget(ticket);
        }
    }
}

impl PortBucket {
    fn kv<'a, T: 'a>(
        &self,
        call: KvCall,
        key: &str,
        value: Bytes,
        answer: fn(JsValue) -> T,
    ) -> Pending<'a, LinkResult<T>>
    where
        KvFuture<T>: Send,
    {
        Box::pin(KvFuture {
            port: self.port.clone(),
            call,
            bucket: self.name.clone(),
            key: key.to_string(),
            value,
            ticket: None,
            answer,
        })
    }
}

impl Bucket for PortBucket {
    fn get<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Bytes>>> {
        self.kv(KvCall::Get, key, Bytes::new(), |v| optional_bytes(&v))
    }

    fn entry<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<Option<Entry>>> {
        self.kv(KvCall::Entry, key, Bytes::new(), |e| {
            (!e.is_null() && !e.is_undefined()).then(|| Entry {
                value: optional_bytes(&field(&e, "value")).unwrap_or_default(),
                deleted: field(&e, "deleted").is_truthy(),
            })
        })
    }

    fn put<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>> {
        self.kv(KvCall::Put, key, value, |_| ())
    }

    fn create<'a>(&'a self, key: &'a str, value: Bytes) -> Pending<'a, LinkResult<()>> {
        self.kv(KvCall::Create, key, value, |_| ())
    }

    fn delete<'a>(&'a self, key: &'a str) -> Pending<'a, LinkResult<()>> {
        done(self.port.0.kv_delete(&self.name, key).map_err(link_error))
    }

    /// Queued in the port: no round trip.
    fn discard<'a>(&'a self, key: &'a str) -> Pending<'a, ()> {
        let _ = self.port.0.kv_discard(&self.name, key);
        Box::pin(std::future::ready(()))
    }

    fn watch<'a>(&'a self, pattern: &'a str) -> Pending<'a, LinkResult<Box<dyn Watch>>> {
        let wid = next_id(&self.state);
        let watching = self.port.0.kv_watch(wid, &self.name, pattern);
        done(watching.map_err(link_error).map(|()| {
            Box::new(PortWatch {
                port: self.port.clone(),
                wid,
            }) as Box<dyn Watch>
        }))
    }

    /// Pending until due while polled between the caller's steps (its steps go on meanwhile);
    /// waited for (the sync point's end), it sleeps what is left in the port.
    fn pause(&self, duration: Duration) -> Pending<'static, ()> {
        let due = Instant::now() + duration;
        let port = self.port.clone();
        Box::pin(std::future::poll_fn(move |_| {
            let left = due.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                if polled_between_steps() {
                    return std::task::Poll::Pending;
                }
                let _ = port.0.sleep(left.as_secs_f64() * 1e3);
            }
            std::task::Poll::Ready(())
        }))
    }
}

/// A watch through the port.
struct PortWatch {
    port: Shared,
    wid: u32,
}

impl Watch for PortWatch {
    /// Pending until an update is there or the deadline is due while polled between the
    /// caller's steps (its steps go on meanwhile); waited for (the sync point's end), it waits
    /// in the port.
    fn next_before(&mut self, deadline: Instant) -> Pending<'_, Watched> {
        Box::pin(std::future::poll_fn(move |_| {
            if !polled_between_steps() {
                let wait = deadline.saturating_duration_since(Instant::now());
                return std::task::Poll::Ready(self.next_now(wait));
            }
            if let Some(update) = self.ready() {
                return std::task::Poll::Ready(Watched::Update(update));
            }
            if Instant::now() < deadline {
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(self.next_now(Duration::ZERO))
        }))
    }

    fn ready(&mut self) -> Option<Update> {
        match self.port.0.watch_ready(self.wid) {
            Ok(v) if v.is_object() => Some(update(&v)),
            _ => None,
        }
    }
}

impl PortWatch {
    /// The next change, waiting up to `wait` in the port.
    fn next_now(&self, wait: Duration) -> Watched {
        match self.port.0.watch_next(self.wid, wait.as_secs_f64() * 1e3) {
            Ok(v) if v.as_string().as_deref() == Some("quiet") => Watched::Quiet,
            Ok(v) if v.is_object() => Watched::Update(update(&v)),
            _ => Watched::Ended,
        }
    }
}

impl Drop for PortWatch {
    fn drop(&mut self) {
        let _ = self.port.0.unwatch(self.wid);
    }
}

/// How `World.joinNats` joins a run.
#[derive(serde::Deserialize, tsify::Tsify)]
#[serde(rename_all = "camelCase")]
#[tsify(rename = "NatsJoinOptions")]
pub struct NatsJoinSettings {
    /// The run's name: letters, digits, `-` and `_`.
    #[tsify(type = "string")]
    run: Option<String>,
    /// Ranks in the run (the target world size).
    #[tsify(type = "number")]
    ranks: Option<usize>,
    /// The rank to take; the lowest free one when omitted.
    #[tsify(optional)]
    rank: Option<usize>,
    /// Join a running run: take a rank that left, be admitted and healed at its next sync
    /// point.
    #[tsify(optional)]
    join: Option<bool>,
    /// Seconds a rank may be silent before a collective waiting on it fails (5).
    #[tsify(optional)]
    failure_bound: Option<f64>,
    /// Seconds to wait for every rank to join (60).
    #[tsify(optional)]
    join_timeout: Option<f64>,
}

/// `World.joinNats`'s options as the library's (`NatsJoinOptions`).
pub(crate) fn join_options(value: &JsValue) -> distopt::error::Result<NatsOptions> {
    use super::settings::{options_naming, read_js};
    use distopt::error::Error;
    const NOT_OBJECT: &str = "joinNats options must be an object with run and ranks";
    let s: NatsJoinSettings = read_js(
        value,
        "options",
        NOT_OBJECT,
        &options_naming("World.joinNats", |key| format!("options.{key}")),
    )?
    .ok_or_else(|| Error::type_error(NOT_OBJECT))?;
    let run = s
        .run
        .ok_or_else(|| Error::type_error("options.run must be a string, got undefined"))?;
    let ranks = s.ranks.ok_or_else(|| {
        Error::type_error("options.ranks must be a non-negative integer, got undefined")
    })?;
    let mut options = NatsOptions::new(String::new(), run, ranks);
    options.rank = s.rank;
    options.join = s.join.unwrap_or(false);
    for (key, given, slot) in [
        ("failureBound", s.failure_bound, &mut options.failure_bound),
        ("joinTimeout", s.join_timeout, &mut options.join_timeout),
    ] {
        let Some(seconds) = given else { continue };
        *slot = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                Error::value(format!(
                    "options.{key} must be a positive number of seconds, got {}",
                    super::convert::js_number(seconds)
                ))
            })?;
    }
    Ok(options)
}
