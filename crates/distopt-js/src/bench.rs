//! `StepBench`: the data-parallel SGD step resident on the backend, for timing from JS (the
//! browser's counterpart of the resident row of `distopt bench step`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;

use super::boundary::{busy, js};
use super::convert::{count_arg, or_undefined};
use super::session::current_backend;
use super::typings::IntegerArg;
use distopt::backend::Backend;
use distopt::bench::ResidentStep;
use distopt::dtype::DType;
use distopt::error::{Error, Result};
use distopt::replicas::Values;

#[wasm_bindgen]
extern "C" {
    /// The dtype a `StepBench` times.
    #[wasm_bindgen(typescript_type = "'float32' | 'float16' | 'bfloat16'")]
    pub type BenchDTypeArg;

    /// The arena `StepBench.read` reads.
    #[wasm_bindgen(typescript_type = "'params' | 'grads'")]
    pub type ArenaArg;
}

/// The data-parallel SGD step resident on the current backend (R ranks of N elements), for
/// timing: each `run()` is one fused step and a wait for the device.
///
/// It is the workload `distopt bench step` times: each fused step is the mean of the gradients
/// and the SGD update, on every rank, and moves `bytes` bytes.
#[wasm_bindgen]
pub struct StepBench {
    backend: Arc<dyn Backend>,
    bench: Rc<RefCell<ResidentStep>>,
    ranks: usize,
    elements: usize,
    dtype: DType,
    bytes: u64,
}

#[wasm_bindgen]
impl StepBench {
    /// Fills the arenas (parameters from seed 0, rank r's gradients from seed r + 1) and waits
    /// for the device (dtype default `'float32'`).
    #[wasm_bindgen(unchecked_return_type = "Promise<StepBench>")]
    pub fn create(
        ranks: IntegerArg,
        elements: IntegerArg,
        dtype: Option<BenchDTypeArg>,
    ) -> Promise {
        let dtype = or_undefined(dtype);
        let ranks = count_arg(&ranks, "ranks");
        let elements = count_arg(&elements, "elements");
        let dtype = super::convert::optional_string(&dtype, "dtype");
        super::boundary::promise_now(async move {
            let ranks = js(ranks)?;
            let elements = js(elements)?;
            let dtype = js(dtype)?;
            let dtype = js(DType::parse(dtype.as_deref().unwrap_or("float32")))?;
            // The JS face's own limits, named after its class; the library checks the rest
            // (the dtype, the memory budget).
            if ranks == 0 || elements == 0 {
                return Err(super::boundary::js_error(Error::value(
                    "StepBench needs at least one rank and one element",
                )));
            }
            if ranks.checked_mul(elements).is_none_or(|n| n > 1 << 28) {
                return Err(super::boundary::js_error(Error::value(
                    "StepBench: ranks × elements is too large",
                )));
            }
            let backend = js(current_backend())?;
            let bench = js(ResidentStep::new(backend.as_ref(), ranks, elements, dtype))?;
            js(backend.synchronize().await)?;
            Ok(StepBench {
                ranks,
                elements,
                dtype,
                bytes: bench.bytes(),
                bench: Rc::new(RefCell::new(bench)),
                backend,
            }
            .into())
        })
    }

    /// One step, resolved when the device has finished it.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn run(&self) -> Promise {
        let (bench, backend) = (self.bench.clone(), self.backend.clone());
        super::boundary::promise_now(async move {
            {
                let mut guard = js(bench.try_borrow_mut().map_err(|_| busy("StepBench")))?;
                js(guard.step(backend.as_ref()))?;
            }
            js(backend.synchronize().await)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Rank `rank`'s parameters or gradients read back (N values; float32 benches only), to
    /// hand a peer the same tensors and check its answer.
    #[wasm_bindgen(unchecked_return_type = "Promise<Float32Array>")]
    pub fn read(&self, which: ArenaArg, rank: IntegerArg) -> Promise {
        let which = super::convert::optional_string(&which, "which");
        let rank = super::convert::rank_arg(&rank, self.ranks);
        let (bench, elements, dtype) = (self.bench.clone(), self.elements, self.dtype);
        super::boundary::promise_now(async move {
            let which = js(which)?;
            let rank = js(rank)?;
            if dtype != DType::Float32 {
                return Err(super::boundary::js_error(Error::value(format!(
                    "StepBench.read returns float32 values; this bench times {}",
                    dtype.name()
                ))));
            }
            let words = js(read_arena(&bench, which.as_deref(), rank, elements).await)?;
            let values: Vec<f32> = words[..elements]
                .iter()
                .map(|&w| f32::from_bits(w))
                .collect();
            Ok(js_sys::Float32Array::from(&values[..]).into())
        })
    }

    /// Bytes one step moves: (2R + 2)·N·element size.
    #[wasm_bindgen(getter)]
    pub fn bytes(&self) -> f64 {
        self.bytes as f64
    }

    /// R, the number of ranks.
    #[wasm_bindgen(getter)]
    pub fn ranks(&self) -> f64 {
        self.ranks as f64
    }

    /// N, the elements of each rank's parameters (and gradients).
    #[wasm_bindgen(getter)]
    pub fn elements(&self) -> f64 {
        self.elements as f64
    }

    /// The dtype timed.
    #[wasm_bindgen(getter, unchecked_return_type = "DType")]
    pub fn dtype(&self) -> String {
        self.dtype.name().into()
    }

    /// The backend the arenas live on.
    #[wasm_bindgen(getter, unchecked_return_type = "BackendInfo")]
    pub fn backend(&self) -> super::boundary::JsResult<JsValue> {
        super::session::backend_info_to_js(self.backend.info())
    }
}

/// Reads rank `rank` of the named arena. The shared borrow is held across the read (as
/// `Replicas` reads do): a `run()` meanwhile is a `RuntimeError` (busy), never a race.
#[allow(clippy::await_holding_refcell_ref)]
async fn read_arena(
    bench: &RefCell<ResidentStep>,
    which: Option<&str>,
    rank: usize,
    elements: usize,
) -> Result<Vec<u32>> {
    let guard = bench.try_borrow().map_err(|_| busy("StepBench"))?;
    let arena = match which.unwrap_or("") {
        "params" => guard.arena(Values::Params),
        "grads" => guard.arena(Values::Grads),
        other => {
            return Err(Error::value(format!(
                "StepBench.read reads \"params\" or \"grads\", not {other:?}"
            )));
        }
    };
    arena.read_range(rank, 0, elements).await
}

/// Resolves when the current backend has finished the work queued so far (to time `step()`; on
/// the CPU backend at once).
#[wasm_bindgen(unchecked_return_type = "Promise<void>")]
pub fn synchronize() -> Promise {
    let backend = current_backend();
    super::boundary::promise_now(async move {
        let backend = js(backend)?;
        js(backend.synchronize().await)?;
        Ok(JsValue::UNDEFINED)
    })
}
