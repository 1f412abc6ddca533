//! `StepBench`: the data-parallel SGD step resident on the backend, for timing from JS (the
//! browser's counterpart of the resident row of `distopt bench step`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::convert::count_arg;
use super::{busy, current_backend, js};
use distopt::backend::{Arena, Backend, layout_params};
use distopt::dtype::DType;
use distopt::error::{Error, Result};
use distopt::tensor::HostData;

/// The learning rate of the timed steps (any value does).
const LEARNING_RATE: f32 = 1e-3;

struct Arenas {
    params: Arena,
    grads: Arena,
    means: Arena,
}

/// R ranks' parameters and gradients of N elements resident on the backend; each `run()` is
/// one fused step (mean of the gradients + SGD update, every rank) followed by a wait for the
/// device, so that JS can time it. Each step moves `bytes` bytes: R gradient and R parameter
/// rows read and written, and the means.
#[wasm_bindgen]
pub struct StepBench {
    backend: Arc<dyn Backend>,
    arenas: Rc<RefCell<Arenas>>,
    ranks: usize,
    elements: usize,
    dtype: DType,
}

/// Deterministic values in [-1, 1) (xorshift64*), different per `seed`.
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
            bits as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect()
}

impl StepBench {
    fn build(ranks: usize, elements: usize, dtype: DType) -> Result<StepBench> {
        if ranks == 0 || elements == 0 {
            return Err(Error::value(
                "StepBench needs at least one rank and one element",
            ));
        }
        if dtype == DType::Float64 {
            return Err(Error::value(
                "StepBench times float32, float16 or bfloat16 (float64 runs as float32 in the step)",
            ));
        }
        ranks
            .checked_mul(elements)
            .filter(|&n| n <= 1 << 28)
            .ok_or_else(|| Error::value("StepBench: ranks × elements is too large"))?;
        let backend = current_backend()?;
        let format = dtype.storage();
        let (_, rank_len) = layout_params(&[elements]);
        // Three arenas ((2R + 1) rank slices) plus two packed images and their values, checked
        // against the module's budget before anything is allocated (a GPU backend keeps the
        // arenas on the device, but stages them through the module).
        let element_bytes = dtype.size_bytes() as u64;
        let arenas = (2 * ranks as u64 + 1) * rank_len as u64 * element_bytes;
        let staging = 2 * rank_len as u64 * 4 + elements as u64 * 8;
        super::budget::check(
            &format!("StepBench.create({ranks}, {elements})"),
            arenas + staging,
        )?;
        let chunk_len = backend.chunk_len(rank_len, ranks);
        let mut params = backend.create_arena(format, ranks, rank_len, chunk_len)?;
        let mut grads = backend.create_arena(format, ranks, rank_len, chunk_len)?;
        let means = backend.create_arena(format, 1, rank_len, chunk_len)?;
        let pack = |seed: u64| {
            let mut words = vec![0u32; format.words_for(rank_len)];
            HostData::from_f64(dtype, &values(seed, elements)).encode_into(format, &mut words);
            words
        };
        let words = pack(0);
        for rank in 0..ranks {
            params.write(rank, 0, &words)?;
        }
        for rank in 0..ranks {
            grads.write(rank, 0, &pack(rank as u64 + 1))?;
        }
        Ok(StepBench {
            backend,
            arenas: Rc::new(RefCell::new(Arenas {
                params,
                grads,
                means,
            })),
            ranks,
            elements,
            dtype,
        })
    }
}

#[wasm_bindgen]
impl StepBench {
    /// Fills the arenas (parameters from seed 0, rank r's gradients from seed r + 1) on the
    /// current backend and waits until they are on the device. `dtype` defaults to float32.
    pub fn create(ranks: JsValue, elements: JsValue, dtype: JsValue) -> Promise {
        let ranks = count_arg(&ranks, "ranks");
        let elements = count_arg(&elements, "elements");
        let dtype = super::convert::optional_string(&dtype, "dtype");
        future_to_promise(async move {
            let ranks = js(ranks)?;
            let elements = js(elements)?;
            let dtype = js(dtype)?;
            let dtype = js(DType::parse(dtype.as_deref().unwrap_or("float32")))?;
            let bench = js(StepBench::build(ranks, elements, dtype))?;
            js(bench.backend.synchronize().await)?;
            Ok(bench.into())
        })
    }

    /// One resident step, resolved when the device has finished it.
    pub fn run(&self) -> Promise {
        let (arenas, backend) = (self.arenas.clone(), self.backend.clone());
        future_to_promise(async move {
            {
                let mut guard = js(arenas.try_borrow_mut().map_err(|_| busy("StepBench")))?;
                let a = &mut *guard;
                js(backend.dp_sgd_step(&mut a.params, &a.grads, &mut a.means, LEARNING_RATE))?;
            }
            js(backend.synchronize().await)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Rank `rank`'s parameters (`"params"`) or gradients (`"grads"`) read back as a
    /// `Float32Array` of N values (float32 benches only), so that a page can hand a peer the
    /// same tensors and check its answer against this step's.
    pub fn read(&self, which: JsValue, rank: JsValue) -> Promise {
        let which = super::convert::optional_string(&which, "which");
        let rank = super::convert::rank_arg(&rank, self.ranks);
        let (arenas, elements, dtype) = (self.arenas.clone(), self.elements, self.dtype);
        future_to_promise(async move {
            let which = js(which)?;
            let rank = js(rank)?;
            if dtype != DType::Float32 {
                return Err(super::js_error(Error::value(format!(
                    "StepBench.read returns float32 values; this bench times {}",
                    dtype.name()
                ))));
            }
            let words = js(read_arena(&arenas, which.as_deref(), rank, elements).await)?;
            let values: Vec<f32> = words[..elements]
                .iter()
                .map(|&w| f32::from_bits(w))
                .collect();
            Ok(js_sys::Float32Array::from(&values[..]).into())
        })
    }

    /// Bytes one step moves: `(2R + 2) · N · element size`.
    #[wasm_bindgen(getter)]
    pub fn bytes(&self) -> f64 {
        ((2 * self.ranks + 2) * self.elements * self.dtype.size_bytes()) as f64
    }

    /// R.
    #[wasm_bindgen(getter)]
    pub fn ranks(&self) -> f64 {
        self.ranks as f64
    }

    /// N.
    #[wasm_bindgen(getter)]
    pub fn elements(&self) -> f64 {
        self.elements as f64
    }

    /// The dtype timed.
    #[wasm_bindgen(getter)]
    pub fn dtype(&self) -> String {
        self.dtype.name().into()
    }

    /// The backend the arenas live on.
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> js_sys::Object {
        super::backend_info_to_js(self.backend.info())
    }
}

/// Reads rank `rank` of the named arena. The shared borrow is held across the read (as
/// `Replicas` reads do): a `run()` meanwhile is a `RuntimeError` (busy), never a race.
#[allow(clippy::await_holding_refcell_ref)]
async fn read_arena(
    arenas: &RefCell<Arenas>,
    which: Option<&str>,
    rank: usize,
    elements: usize,
) -> Result<Vec<u32>> {
    let guard = arenas.try_borrow().map_err(|_| busy("StepBench"))?;
    let arena = match which.unwrap_or("") {
        "params" => &guard.params,
        "grads" => &guard.grads,
        other => {
            return Err(Error::value(format!(
                "StepBench.read reads \"params\" or \"grads\", not {other:?}"
            )));
        }
    };
    arena.read_range(rank, 0, elements).await
}

/// Resolves when the current backend has finished all the work queued on it so far (on the
/// CPU backend at once): lets a page time a synchronous call such as `optimizer.step()`.
#[wasm_bindgen]
pub fn synchronize() -> Promise {
    let backend = current_backend();
    future_to_promise(async move {
        let backend = js(backend)?;
        js(backend.synchronize().await)?;
        Ok(JsValue::UNDEFINED)
    })
}
