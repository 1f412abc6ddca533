//! `distopt bench average | optim | zero`: one averaging step, one optimizer step and one ZeRO
//! step over R ranks × N elements, resident on the backend, next to the backend's own copy of
//! the same bytes measured in the same run.
//!
//! Each row is the median of `--repeats` timed runs after one warm-up. Throughput counts the
//! bytes the kernel must read and write; the copy row moves an arena of the same size, counted
//! as read + write, so the ratio is the fraction of the memory system the kernel reaches.

use crate::output::outln;
use std::sync::Arc;
use std::time::Instant;

use distopt::BlockOn;
use distopt::averaging::average_parameters;
use distopt::backend::select_backend;
use distopt::comm::{Communicator, SimulatedWorld, Subgroups};
use distopt::optim::{Adam, AdamOptions, LocalOptimizer, OptionMap, Sgd, SgdOptions};
use distopt::replicas::Replicas;
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, Error, StorageFormat, Tensor};
use serde_json::{Value, json};

use crate::args::{AlgorithmBenchArgs, ZeroBenchArgs};

struct Config {
    ranks: usize,
    elements: usize,
    params: Vec<usize>,
    repeats: usize,
    /// The parameters' dtype (`bench optim --dtype`; float32 elsewhere).
    dtype: distopt::DType,
    backend: Arc<dyn Backend>,
    /// The same adapter opened as a `GpuBackend` when the backend is a GPU (its rooflines).
    gpu: Option<distopt::GpuBackend>,
    reason: String,
    json: bool,
}

/// Host memory one model of `ranks` × `elements` float32 elements in `params` parameters needs,
/// with `arenas` arenas of its size (parameters, gradients, optimizer state, the copy rows):
/// checked against the memory budget ([`distopt::budget`]) before anything is allocated, so
/// that absurd sizes are a clear error instead of an abort or the machine swapping.
fn check_size(
    bench: &str,
    ranks: usize,
    elements: usize,
    params: &[usize],
    arenas: usize,
) -> Result<(), Error> {
    for &p in params {
        let p = p.min(elements);
        let what = format!("bench {bench} with R = {ranks}, N = {elements}, P = {p}");
        let overflow = || {
            Error::runtime(format!(
                "not enough memory for {what}: the sizes overflow the address space"
            ))
        };
        // Each parameter starts on a 64-element slot; the host tensors the model is built
        // from (f64 values, float32 tensors, gradients) and each parameter's bookkeeping.
        let padded = p
            .checked_mul(distopt::backend::PARAM_ALIGN_ELEMENTS)
            .and_then(|pad| pad.checked_add(elements))
            .ok_or_else(overflow)?;
        let bytes = ranks
            .checked_mul(padded)
            .and_then(|x| x.checked_mul(4 * arenas))
            .and_then(|x| x.checked_add(elements.checked_mul(24)?))
            .and_then(|x| x.checked_add(p.checked_mul(512)?))
            .ok_or_else(overflow)?;
        distopt::budget::check(bytes, &what)?;
    }
    Ok(())
}

impl Config {
    /// The configuration of `bench NAME` from its flags, with that benchmark's defaults, after
    /// a size check of `arenas` arenas of the model's size.
    fn from_args(
        name: &str,
        args: AlgorithmBenchArgs,
        defaults: (usize, usize, &[usize]),
        arenas: usize,
    ) -> Result<Config, Error> {
        let (default_ranks, default_elements, default_params) = defaults;
        let ranks = args.ranks.unwrap_or(default_ranks);
        let elements = args.elements.unwrap_or(default_elements);
        let params = args.params.unwrap_or_else(|| default_params.to_vec());
        let dtype = match args.dtype {
            None => distopt::DType::Float32,
            Some(
                d @ (distopt::DType::Float32 | distopt::DType::BFloat16 | distopt::DType::Float16),
            ) => d,
            Some(other) => {
                return Err(Error::value(format!(
                    "--dtype must be float32, bfloat16 or float16, got {}",
                    other.name()
                )));
            }
        };
        check_size(name, ranks, elements, &params, arenas)?;
        let selection = select_backend(args.backend).block_on()?;
        let gpu = if selection.backend.info().kind == distopt::BackendKind::Gpu {
            distopt::GpuBackend::new().block_on().ok()
        } else {
            None
        };
        Ok(Config {
            gpu,
            ranks,
            elements,
            params,
            repeats: args.repeats,
            dtype,
            backend: selection.backend,
            reason: selection.reason,
            json: args.json,
        })
    }
}

/// Median seconds of `repeats` runs of `f` (after one warm-up), each ended by a synchronize.
fn median_seconds(
    backend: &dyn Backend,
    repeats: usize,
    mut f: impl FnMut() -> Result<(), Error>,
) -> Result<f64, Error> {
    f()?;
    pollster::block_on(backend.synchronize())?;
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        f()?;
        pollster::block_on(backend.synchronize())?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `params` float32 parameters totalling `elements`, replicated on `ranks` ranks, each rank
/// with a gradient for every parameter.
fn model(
    backend: &Arc<dyn Backend>,
    ranks: usize,
    elements: usize,
    params: usize,
) -> Result<Replicas, Error> {
    model_of(backend, distopt::DType::Float32, ranks, elements, params)
}

/// [`model`] with parameters and gradients of `dtype`.
fn model_of(
    backend: &Arc<dyn Backend>,
    dtype: distopt::DType,
    ranks: usize,
    elements: usize,
    params: usize,
) -> Result<Replicas, Error> {
    let params = params.min(elements).max(1);
    let sizes: Vec<usize> = (0..params)
        .map(|p| elements / params + usize::from(p < elements % params))
        .collect();
    let values: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(p, &n)| {
            let values: Vec<f64> = (0..n).map(|i| ((i + p) % 97) as f64 * 0.01).collect();
            Tensor::from_f64(dtype, &[n], &values)
        })
        .collect::<Result<_, _>>()?;
    let grads: Vec<Option<Tensor>> = sizes
        .iter()
        .map(|&n| Tensor::from_f64(dtype, &[n], &vec![0.001; n]).map(Some))
        .collect::<Result<_, _>>()?;
    let mut replicas = Replicas::replicate(backend.clone(), ranks, &values)?;
    for rank in 0..ranks {
        replicas.set_grads(rank, &grads)?;
    }
    Ok(replicas)
}

/// The backend copying an arena of `ranks × elements` float32 values: seconds per copy.
fn copy_seconds(config: &Config, ranks: usize, elements: usize) -> Result<f64, Error> {
    let backend = config.backend.as_ref();
    let chunk = backend.chunk_len(elements, ranks);
    let source = backend.create_arena(StorageFormat::F32, ranks, elements, chunk)?;
    let mut target = backend.create_arena(StorageFormat::F32, ranks, elements, chunk)?;
    median_seconds(backend, config.repeats, || {
        backend.copy_arena(&source, &mut target)
    })
}

fn gbps(bytes: f64, seconds: f64) -> f64 {
    bytes / seconds / 1e9
}

struct Row {
    name: String,
    params: usize,
    seconds: f64,
    bytes: f64,
    /// Seconds of the same-traffic roofline (CPU backend), when measured.
    roofline: Option<f64>,
}

/// The loads and stores a kernel makes per element, counted in arrays of the arena's size:
/// read only, read and written, written only.
#[derive(Clone, Copy)]
struct Traffic {
    read: usize,
    update: usize,
    write: usize,
}

/// Seconds of the roofline of a kernel's traffic over arrays of `words` words: on the CPU
/// backend the same-traffic kernel ([`distopt::backend::roofline::same_traffic`]) on its
/// threads, on a GPU the copy shader moving the same bytes ([`distopt::GpuBackend::shader_copy`]).
fn roofline_seconds(config: &Config, traffic: Traffic, words: usize) -> Result<Option<f64>, Error> {
    if let Some(gpu) = &config.gpu {
        // The GPU roofline: the copy shader moving the same bytes (read + write counted).
        let moved = traffic.read + 2 * traffic.update + traffic.write;
        let words = (moved * words).div_ceil(2);
        let rank_len = words.div_ceil(64) * 64;
        let chunk = gpu.chunk_len(rank_len, 1);
        let src = gpu.create_arena(StorageFormat::F32, 1, rank_len, chunk)?;
        let mut dst = gpu.create_arena(StorageFormat::F32, 1, rank_len, chunk)?;
        return median_seconds(gpu, config.repeats, || gpu.shader_copy(&src, &mut dst)).map(Some);
    }
    if config.backend.info().kind != distopt::BackendKind::Cpu {
        return Ok(None);
    }
    let mut roof = distopt::backend::roofline::SameTraffic::new(
        config.backend.info().threads,
        traffic.read,
        traffic.update,
        traffic.write,
        words,
    )?;
    median_seconds(config.backend.as_ref(), config.repeats, || roof.run()).map(Some)
}

fn print(config: &Config, title: &str, rows: &[Row], copy: f64, copy_bytes: f64, extra: Value) {
    let copy_gbps = gbps(copy_bytes, copy);
    if config.json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                let roofline = r.roofline.map(|t| gbps(r.bytes, t));
                json!({"kernel": r.name, "params": r.params, "ms": r.seconds * 1e3,
                       "gbps": gbps(r.bytes, r.seconds), "ratio_to_copy": gbps(r.bytes, r.seconds) / copy_gbps,
                       "roofline_gbps": roofline,
                       "ratio_to_roofline": roofline.map(|f| gbps(r.bytes, r.seconds) / f)})
            })
            .collect();
        outln!(
            "{}",
            json!({"bench": title, "backend": config.backend.info().name, "ranks": config.ranks, "dtype": config.dtype.name(),
                   "elements": config.elements, "copy_ms": copy * 1e3, "copy_gbps": copy_gbps,
                   "rows": rows, "extra": extra})
        );
        return;
    }
    outln!(
        "distopt bench {title}: R = {}, N = {} {} elements per rank",
        config.ranks,
        config.elements,
        config.dtype.name()
    );
    outln!(
        "backend: {} ({})",
        config.backend.info().name,
        config.reason
    );
    outln!(
        "{:<28} {:>7} {:>10} {:>9} {:>9} {:>13} {:>9}",
        "kernel",
        "params",
        "median ms",
        "GB/s",
        "vs copy",
        "roofline GB/s",
        "vs roof"
    );
    for r in rows {
        let g = gbps(r.bytes, r.seconds);
        let (roof, vs) = match r.roofline {
            Some(t) => (
                format!("{:.2}", gbps(r.bytes, t)),
                format!("{:.0}%", 100.0 * r.seconds.recip() * t),
            ),
            None => ("-".into(), "-".into()),
        };
        outln!(
            "{:<28} {:>7} {:>10.3} {:>9.2} {:>8.0}% {:>13} {:>9}",
            r.name,
            r.params,
            r.seconds * 1e3,
            g,
            100.0 * g / copy_gbps,
            roof,
            vs
        );
    }
    outln!(
        "{:<28} {:>7} {:>10.3} {:>9.2} {:>8}",
        "backend copy (same bytes)",
        "-",
        copy * 1e3,
        copy_gbps,
        "100%"
    );
    if !extra.is_null() {
        outln!("{extra}");
    }
}

/// `distopt bench average`: all-reduce-mean of every parameter over the world.
pub fn average(args: AlgorithmBenchArgs) -> Result<(), Error> {
    // Parameters, gradients and the two copy arenas.
    let config = Config::from_args("average", args, (8, 1 << 22, &[1, 1000]), 4)?;
    let world = SimulatedWorld::new(config.ranks)?;
    let mut rows = Vec::new();
    for &params in &config.params {
        let mut replicas = model(&config.backend, config.ranks, config.elements, params)?;
        let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
            average_parameters(&world, &mut replicas, Subgroups::world(config.ranks), None)
                .map(drop)
        })?;
        // Every rank's values read once and written once.
        let bytes = (2 * config.ranks * config.elements * 4) as f64;
        let traffic = Traffic {
            read: 0,
            update: 1,
            write: 0,
        };
        rows.push(Row {
            name: "average (world all-reduce)".into(),
            params,
            seconds,
            bytes,
            roofline: roofline_seconds(&config, traffic, config.ranks * config.elements)?,
        });
    }
    let copy = copy_seconds(&config, config.ranks, config.elements)?;
    let stats = world.stats();
    let extra = json!({"all_reduce_bytes_per_rank_per_step": stats.total_bytes() / stats.collectives.max(1)});
    print(
        &config,
        "average",
        &rows,
        copy,
        (2 * config.ranks * config.elements * 4) as f64,
        extra,
    );
    Ok(())
}

/// `distopt bench optim`: one SGD-momentum and one Adam step on every rank; for float16 and
/// bfloat16 parameters also both with `fused=True` (PyTorch's fused arithmetic).
pub fn optim(args: AlgorithmBenchArgs) -> Result<(), Error> {
    // Parameters, gradients, momentum, Adam's two moments and the two copy arenas.
    let config = Config::from_args("optim", args, (8, 1 << 22, &[1, 1000]), 7)?;
    let mut rows = Vec::new();
    let element_bytes = config.dtype.storage().element_bytes();
    let base = (config.ranks * config.elements * element_bytes) as f64;
    for &params in &config.params {
        let mut replicas = model_of(
            &config.backend,
            config.dtype,
            config.ranks,
            config.elements,
            params,
        )?;
        // Reads parameters, gradients, buffers; writes parameters, buffers.
        let words = config
            .dtype
            .storage()
            .words_for(config.ranks * config.elements);
        let sgd_traffic = Traffic {
            read: 1,
            update: 2,
            write: 0,
        };
        // Reads parameters, gradients, both moments; writes parameters and both moments.
        let adam_traffic = Traffic {
            read: 1,
            update: 3,
            write: 0,
        };
        let sgd_roofline = roofline_seconds(&config, sgd_traffic, words)?;
        let adam_roofline = roofline_seconds(&config, adam_traffic, words)?;
        // PyTorch's default arithmetic, and for 16-bit parameters also its `fused=True` one
        // (the same for float32).
        let variants: &[bool] = if config.dtype == distopt::DType::Float32 {
            &[false]
        } else {
            &[false, true]
        };
        for &fused in variants {
            let suffix = if fused { " (fused)" } else { "" };
            let mut sgd = Sgd::new(
                &replicas,
                SgdOptions::default()
                    .with_lr(1e-3)
                    .with_momentum(0.9)
                    .with_fused(fused),
            )?;
            sgd.step(&mut replicas)?; // creates the momentum buffers
            let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
                sgd.step(&mut replicas)
            })?;
            rows.push(Row {
                name: format!("SGD momentum{suffix}"),
                params,
                seconds,
                bytes: 5.0 * base,
                roofline: sgd_roofline,
            });
            drop(sgd);
            let mut adam = Adam::new(&replicas, AdamOptions::default().with_fused(fused))?;
            adam.step(&mut replicas)?;
            let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
                adam.step(&mut replicas)
            })?;
            rows.push(Row {
                name: format!("Adam{suffix}"),
                params,
                seconds,
                bytes: 7.0 * base,
                roofline: adam_roofline,
            });
        }
    }
    // The copy moves the same bytes: a float32 arena of the parameters' size.
    let copy_elements = (config.elements * element_bytes).div_ceil(4);
    let copy = copy_seconds(&config, config.ranks, copy_elements)?;
    print(&config, "optim", &rows, copy, 2.0 * base, Value::Null);
    Ok(())
}

/// `distopt bench zero`: a ZeRO Adam step and the optimizer state per rank for W = 1, 2, 4, 8
/// over the same model.
pub fn zero(args: ZeroBenchArgs) -> Result<(), Error> {
    let worlds = args.worlds;
    let largest = worlds.iter().copied().max().unwrap_or(1);
    // Sized for the largest world: its parameters, gradients and Adam's two moments (--ranks
    // plays no other part in bench zero).
    let mut common = args.common;
    common.ranks = Some(common.ranks.unwrap_or(1).max(largest));
    let config = Config::from_args("zero", common, (1, 1 << 24, &[100]), 4)?;
    let params = config.params.first().copied().unwrap_or(100);
    let mut results = Vec::new();
    for &w in &worlds {
        let mut replicas = model(&config.backend, w, config.elements, params)?;
        let world: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(w)?);
        let groups = vec![((0..replicas.len()).collect::<Vec<_>>(), OptionMap::new())];
        let mut defaults = OptionMap::new();
        defaults.insert("lr".into(), 1e-3.into());
        let options = ZeroOptions::default()
            .with_parameters_as_bucket_view(true)
            .with_overlap_with_ddp(false);
        let mut zero = ZeroRedundancyOptimizer::new(
            world.clone(),
            &replicas,
            groups,
            "Adam",
            &defaults,
            options,
        )?;
        zero.step(&mut replicas)?;
        world.reset_stats();
        let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
            zero.step(&mut replicas).map_err(Error::from)
        })?;
        let state = zero.state_bytes_per_rank();
        let stats = world.stats();
        let steps = (config.repeats + 1) as u64;
        results.push(json!({
            "world_size": w,
            "step_ms": seconds * 1e3,
            "state_bytes_per_rank": state,
            "max_state_bytes_per_rank": state.iter().max(),
            "broadcast_bytes_per_rank_per_step": stats.broadcast_bytes / steps,
        }));
    }
    let full_state = (2 * config.elements * 4) as f64;
    if config.json {
        outln!(
            "{}",
            json!({"bench": "zero", "backend": config.backend.info().name, "elements": config.elements,
                   "params": params, "optimizer": "Adam", "unsharded_state_bytes": full_state, "worlds": results})
        );
        return Ok(());
    }
    outln!(
        "distopt bench zero: Adam, {params} parameters, {} float32 elements",
        config.elements
    );
    outln!(
        "backend: {} ({})",
        config.backend.info().name,
        config.reason
    );
    outln!(
        "{:>3} {:>12} {:>16} {:>12} {:>18}",
        "W",
        "step ms",
        "state MiB/rank",
        "of full",
        "bcast MiB/rank"
    );
    for r in &results {
        let max = r["max_state_bytes_per_rank"].as_f64().unwrap_or(0.0);
        outln!(
            "{:>3} {:>12.2} {:>16.2} {:>11.1}% {:>18.2}",
            r["world_size"],
            r["step_ms"].as_f64().unwrap_or(0.0),
            max / (1 << 20) as f64,
            100.0 * max / full_state,
            r["broadcast_bytes_per_rank_per_step"]
                .as_f64()
                .unwrap_or(0.0)
                / (1 << 20) as f64
        );
    }
    Ok(())
}
