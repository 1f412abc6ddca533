//! `World`: a simulated world of R ranks and the bytes its collectives would have moved, or
//! this process's rank of a run over NATS (`World.joinNats`, `nats.rs`).

use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{count_arg, optional_integer_arg, or_undefined, rank_arg, set};
use super::handles;
use super::typings::{IntegerArg, to_js};
use distopt::comm::{
    CommStats as LibCommStats, Communicator, NatsWorld, SimulatedWorld, Subgroups, new_subgroups,
};
use distopt::error::Result;

/// A world of R ranks simulated on one device (`SimulatedWorld`), with its communication
/// statistics, or this process's rank of a run over NATS (`World.joinNats`). Averagers, DiLoCo
/// and the post-local-SGD gradient hook run their collectives on it.
#[wasm_bindgen(js_name = World)]
pub struct WorldJs {
    inner: Rc<WorldHandle>,
}

/// The world shared with everything made over it.
pub(crate) struct WorldHandle {
    world: Arc<dyn Communicator>,
    /// The same world when it is a rank of a run over NATS.
    networked: Option<Arc<NatsWorld>>,
    /// Whether this process joined a running run (to be taken in at its next sync point).
    joining: bool,
}

impl WorldHandle {
    /// The world as the library's communicator.
    pub(crate) fn communicator(&self) -> Arc<dyn Communicator> {
        self.world.clone()
    }

    /// Whether this process joined a running run (`joinNats` with `join: true`).
    pub(crate) fn joining(&self) -> bool {
        self.joining
    }
}

/// The world behind a JS `World` argument, with what it knows of itself.
pub(crate) fn world_handle_of(value: &JsValue) -> Result<Rc<WorldHandle>> {
    handles::resolve::<WorldHandle>(value, "__distoptWorld", "world must be a World")
}

/// The world behind a JS `World` argument.
pub(crate) fn world_of(value: &JsValue) -> Result<Arc<dyn Communicator>> {
    handles::resolve::<WorldHandle>(value, "__distoptWorld", "world must be a World")
        .map(|w| Arc::clone(&w.world))
}

/// The world as the library's communicator.
pub(crate) fn communicator(world: &Arc<dyn Communicator>) -> Arc<dyn Communicator> {
    world.clone()
}

/// The partition into groups of `group_size` ranks (`undefined`/`null`: the whole world),
/// with `new_subgroups`'s errors.
pub(crate) fn subgroups(world: &dyn Communicator, group_size: &JsValue) -> Result<Subgroups> {
    let size = world.world_size();
    match optional_integer_arg(group_size, "groupSize")? {
        None => Ok(Subgroups::world(size)),
        Some(g) => new_subgroups(size, g),
    }
}

/// A sync point of a run whose membership changed (`World.membershipChanges`).
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct MembershipChange {
    /// The sync point's index in the run (0, 1, …).
    sync_point: f64,
    /// The ranks that took part in it.
    live: Vec<f64>,
    /// The ranks taken in after it (healed at its end, taking part from the next one).
    joining: Vec<f64>,
}

/// Bytes each rank sent, by kind of collective (a world's, or a trainer's run's).
#[derive(Serialize, Tsify)]
#[serde(rename_all = "camelCase")]
pub struct CommStats {
    /// Bytes of all-reduces, keyed by the group size they ran over (`"4"`: the whole world of 4).
    #[tsify(type = "Record<string, number>")]
    all_reduce_bytes_by_group_size: std::collections::BTreeMap<String, u64>,
    /// Bytes of broadcasts.
    broadcast_bytes: u64,
    /// Bytes of gathers.
    gather_bytes: u64,
    /// Collectives run.
    collectives: u64,
    /// All of the above bytes.
    total_bytes: u64,
}

/// `CommStats` as JS reads it (bytes per rank).
pub(crate) fn stats_to_js(stats: &LibCommStats) -> JsResult<JsValue> {
    to_js(&CommStats {
        all_reduce_bytes_by_group_size: stats
            .all_reduce_bytes_by_group_size
            .iter()
            .map(|(size, bytes)| (size.to_string(), *bytes))
            .collect(),
        broadcast_bytes: stats.broadcast_bytes,
        gather_bytes: stats.gather_bytes,
        collectives: stats.collectives,
        total_bytes: stats.total_bytes(),
    })
}

#[wasm_bindgen(js_class = World)]
impl WorldJs {
    /// A world of `size` ranks (at least one).
    #[wasm_bindgen(constructor)]
    pub fn new(size: IntegerArg) -> JsResult<WorldJs> {
        let size = js(count_arg(&size, "size"))?;
        let world: Arc<dyn Communicator> = Arc::new(js(SimulatedWorld::new(size))?);
        let inner = Rc::new(WorldHandle {
            world,
            networked: None,
            joining: false,
        });
        Ok(WorldJs { inner })
    }

    /// Joins run `options.run` of `options.ranks` ranks over `port` (a connection to a NATS
    /// server with JetStream: `await openPort({servers})`, from `distopt/nats`) and waits until
    /// every rank has joined: this process's rank of it, a world whose replicas hold that one
    /// rank. Its collectives block this thread until the other ranks' data has arrived, so
    /// call it in Node or in a Worker (a browser page's main thread cannot block).
    ///
    /// Options: `run` (letters, digits, `-`, `_`), `ranks`, and optionally `rank` (the rank to
    /// take; the lowest free one by default), `join` (join a running run, healed from a live
    /// rank at its next sync point), `failureBound` (seconds a rank may be silent before a
    /// collective waiting on it fails; 5), `joinTimeout` (seconds to wait for the run; 60).
    #[wasm_bindgen(js_name = joinNats)]
    pub fn join_nats(
        #[wasm_bindgen(unchecked_param_type = "Port")] port: JsValue,
        #[wasm_bindgen(unchecked_param_type = "NatsJoinOptions")] options: JsValue,
    ) -> JsResult<WorldJs> {
        #[cfg(not(target_feature = "atomics"))]
        {
            let options = js(super::nats::join_options(&options))?;
            let link = Arc::new(js(super::nats::PortLink::new(port))?);
            let networked = js(NatsWorld::join_over(&options, link))?;
            let inner = Rc::new(WorldHandle {
                world: networked.clone(),
                networked: Some(networked),
                joining: options.join,
            });
            Ok(WorldJs { inner })
        }
        #[cfg(target_feature = "atomics")]
        {
            let _ = (port, options);
            Err(super::boundary::js_error(distopt::error::Error::runtime(
                "World.joinNats is not in the threaded build (distopt/threads): a networked rank blocks its thread on the port; import distopt",
            )))
        }
    }

    /// This process's first rank (0 in a simulated world, which holds every rank).
    #[wasm_bindgen(getter)]
    pub fn rank(&self) -> f64 {
        self.inner.world.local_ranks().start as f64
    }

    /// The ranks this process holds: all of them when simulated, its one rank in a run.
    #[wasm_bindgen(getter, js_name = localRanks, unchecked_return_type = "number[]")]
    pub fn local_ranks(&self) -> Vec<JsValue> {
        self.inner
            .world
            .local_ranks()
            .map(|r| JsValue::from_f64(r as f64))
            .collect()
    }

    /// The live ranks agreed at the last sync point (`true` for every rank of a simulated
    /// world, and of a run before its first sync point).
    #[wasm_bindgen(getter, unchecked_return_type = "boolean[]")]
    pub fn live(&self) -> Vec<JsValue> {
        let live = match &self.inner.networked {
            Some(world) => world.live(),
            None => vec![true; self.inner.world.world_size()],
        };
        live.into_iter().map(JsValue::from_bool).collect()
    }

    /// The sync points whose membership changed, in order (none in a simulated world):
    /// `{syncPoint, live, joining}` — the live ranks of that sync and the ranks taken in after
    /// it. This is the schedule a simulated replay takes (`distopt train --membership`).
    #[wasm_bindgen(getter, js_name = membershipChanges, unchecked_return_type = "MembershipChange[]")]
    pub fn membership_changes(&self) -> JsResult<JsValue> {
        let changes: Vec<MembershipChange> = self
            .inner
            .networked
            .as_ref()
            .map(|w| w.membership_changes())
            .unwrap_or_default()
            .into_iter()
            .map(|m| MembershipChange {
                sync_point: m.epoch as f64,
                live: m
                    .live
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| **l)
                    .map(|(r, _)| r as f64)
                    .collect(),
                joining: m.joining.iter().map(|&r| r as f64).collect(),
            })
            .collect();
        to_js(&changes)
    }

    /// Frames dropped because the rank they name did not seal them (0 in a simulated world):
    /// above zero, a client of the run tried to speak for another rank.
    #[wasm_bindgen(getter, js_name = forgedFrames)]
    pub fn forged_frames(&self) -> f64 {
        self.inner
            .networked
            .as_ref()
            .map_or(0.0, |w| w.forged_frames() as f64)
    }

    /// Tells the run that this process leaves it (nothing in a simulated world): the other
    /// ranks count it gone half a second later instead of after the failure bound — a
    /// collective awaiting it fails at once, the next sync point of an elastic algorithm goes
    /// on without it. Call it as the process ends on purpose (Node: on `SIGINT`); freeing the
    /// world and every object that holds it does it too. Use the world no more afterwards.
    pub fn leave(&self) {
        if let Some(world) = &self.inner.networked {
            world.leave();
        }
    }

    /// What `leave()` publishes, for a page that must say it as it closes: the run's subject
    /// and the frames, sealed with this process's key (`null` in a simulated world, for a
    /// joining process not yet taken in, and once it left). A worker blocked in a step cannot
    /// leave while its page closes, so the page keeps these and publishes them itself
    /// (`PUB subject` over a NATS WebSocket of its own, as the demo does on `pagehide`): the
    /// others count this rank gone half a second later instead of after the failure bound.
    #[wasm_bindgen(
        js_name = leavingMessage,
        unchecked_return_type = "{ subject: string; frames: Uint8Array[] } | null"
    )]
    pub fn leaving_message(&self) -> JsValue {
        let Some((subject, frames)) = self
            .inner
            .networked
            .as_ref()
            .and_then(|w| w.leaving_message())
        else {
            return JsValue::NULL;
        };
        let message = js_sys::Object::new();
        set(&message, "subject", subject);
        let list: js_sys::Array = frames
            .iter()
            .map(|f| JsValue::from(js_sys::Uint8Array::from(&f[..])))
            .collect();
        set(&message, "frames", list);
        message.into()
    }

    /// Hands the world to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptWorld, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// Ranks in the world.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> f64 {
        self.inner.world.world_size() as f64
    }

    /// Bytes the collectives so far would have sent per rank, by kind.
    #[wasm_bindgen(unchecked_return_type = "CommStats")]
    pub fn stats(&self) -> JsResult<JsValue> {
        stats_to_js(&self.inner.world.stats())
    }

    /// Clears the statistics.
    #[wasm_bindgen(js_name = resetStats)]
    pub fn reset_stats(&self) {
        self.inner.world.reset_stats();
    }

    /// The ranks of the group of `groupSize` contiguous ranks (`new_subgroups`; default: the
    /// whole world) that `rank` belongs to, with PyTorch's errors for a group size that does
    /// not divide the world.
    #[wasm_bindgen(js_name = groupOf, unchecked_return_type = "number[]")]
    pub fn group_of(
        &self,
        rank: IntegerArg,
        #[wasm_bindgen(js_name = groupSize)] group_size: Option<IntegerArg>,
    ) -> JsResult<Vec<f64>> {
        let group_size = or_undefined(group_size);
        let rank = js(rank_arg(&rank, self.inner.world.world_size()))?;
        let groups = js(subgroups(&*self.inner.world, &group_size))?;
        Ok(groups.group_of(rank).map(|r| r as f64).collect())
    }
}
