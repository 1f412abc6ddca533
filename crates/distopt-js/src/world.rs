//! `World`: a simulated world of R ranks and the bytes its collectives would have moved.

use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use tsify::Tsify;
use wasm_bindgen::prelude::*;

use super::boundary::{JsResult, js};
use super::convert::{count_arg, optional_integer_arg, rank_arg};
use super::handles;
use super::typings::{IntegerArg, to_js};
use distopt::comm::{
    CommStats as LibCommStats, Communicator, SimulatedWorld, Subgroups, new_subgroups,
};
use distopt::error::Result;

/// A world of R ranks simulated on one device (`SimulatedWorld`), with its communication
/// statistics. Averagers and the post-local-SGD gradient hook run their collectives on it.
#[wasm_bindgen(js_name = World)]
pub struct WorldJs {
    inner: Rc<WorldHandle>,
}

/// The world shared with everything made over it.
pub(crate) struct WorldHandle(Arc<SimulatedWorld>);

/// The world behind a JS `World` argument.
pub(crate) fn world_of(value: &JsValue) -> Result<Arc<SimulatedWorld>> {
    handles::resolve::<WorldHandle>(value, "__distoptWorld", "world must be a World")
        .map(|w| Arc::clone(&w.0))
}

/// The world as the library's communicator.
pub(crate) fn communicator(world: &Arc<SimulatedWorld>) -> Arc<dyn Communicator> {
    world.clone()
}

/// The partition into groups of `group_size` ranks (`undefined`/`null`: the whole world),
/// with `new_subgroups`'s errors.
pub(crate) fn subgroups(world: &SimulatedWorld, group_size: &JsValue) -> Result<Subgroups> {
    let size = world.world_size();
    match optional_integer_arg(group_size, "groupSize")? {
        None => Ok(Subgroups::world(size)),
        Some(g) => new_subgroups(size, g),
    }
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
        let inner = Rc::new(WorldHandle(Arc::new(js(SimulatedWorld::new(size))?)));
        Ok(WorldJs { inner })
    }

    /// Hands the world to the call it is passed to (internal: `handles::resolve`).
    #[wasm_bindgen(js_name = __distoptWorld, skip_typescript)]
    pub fn hand_over(&self) {
        handles::hand_over(self.inner.clone());
    }

    /// Ranks in the world.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> f64 {
        self.inner.0.world_size() as f64
    }

    /// Bytes the collectives so far would have sent per rank, by kind.
    #[wasm_bindgen(unchecked_return_type = "CommStats")]
    pub fn stats(&self) -> JsResult<JsValue> {
        stats_to_js(&self.inner.0.stats())
    }

    /// Clears the statistics.
    #[wasm_bindgen(js_name = resetStats)]
    pub fn reset_stats(&self) {
        self.inner.0.reset_stats();
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
        let group_size = group_size.map(JsValue::from).unwrap_or(JsValue::UNDEFINED);
        let rank = js(rank_arg(&rank, self.inner.0.world_size()))?;
        let groups = js(subgroups(&self.inner.0, &group_size))?;
        Ok(groups.group_of(rank).map(|r| r as f64).collect())
    }
}
