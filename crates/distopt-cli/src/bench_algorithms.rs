//! `distopt bench average | optim | zero`: one averaging step, one optimizer step and one ZeRO
//! step over R ranks × N elements, resident on the backend, next to the backend's own copy of
//! the same bytes measured in the same run.
//!
//! Each row is the median of `--repeats` timed runs after one warm-up. Throughput counts the
//! bytes the kernel must read and write; the copy row moves an arena of the same size, counted
//! as read + write, so the ratio is the fraction of the memory system the kernel reaches.

use std::sync::Arc;
use std::time::Instant;

use distopt::averaging::average_parameters;
use distopt::backend::{BackendChoice, select_backend_blocking};
use distopt::comm::{Communicator, SimulatedWorld, Subgroups};
use distopt::optim::{Adam, AdamOptions, LocalOptimizer, OptionMap, Sgd, SgdOptions};
use distopt::replicas::Replicas;
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, Error, StorageFormat, Tensor};
use serde_json::{Value, json};

use crate::{take_flag, take_option};

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

fn count(name: &str, text: &str) -> Result<usize, Error> {
    let value = match text.split_once('^') {
        Some((base, exp)) => base
            .parse::<usize>()
            .ok()
            .zip(exp.parse::<u32>().ok())
            .and_then(|(b, e)| b.checked_pow(e)),
        None => text.parse().ok(),
    };
    value.filter(|&v| v > 0).ok_or_else(|| {
        Error::value(format!(
            "{name} must be a positive integer or a power like 2^22, got {text:?}"
        ))
    })
}

impl Config {
    fn parse(
        args: &mut Vec<String>,
        default_ranks: usize,
        default_elements: usize,
    ) -> Result<Config, Error> {
        let ranks =
            take_option(args, "--ranks")?.map_or(Ok(default_ranks), |t| count("--ranks", &t))?;
        let elements = take_option(args, "--elements")?
            .map_or(Ok(default_elements), |t| count("--elements", &t))?;
        let params = match take_option(args, "--params")? {
            Some(text) => text
                .split(',')
                .map(|p| count("--params", p.trim()))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![1, 1000],
        };
        let repeats = take_option(args, "--repeats")?.map_or(Ok(7), |t| count("--repeats", &t))?;
        let choice = BackendChoice::parse(
            &take_option(args, "--backend")?.unwrap_or_else(|| "auto".into()),
        )?;
        let dtype = match take_option(args, "--dtype")? {
            None => distopt::DType::Float32,
            Some(name) => match distopt::DType::parse(&name)? {
                d @ (distopt::DType::Float32
                | distopt::DType::BFloat16
                | distopt::DType::Float16) => d,
                other => {
                    return Err(Error::value(format!(
                        "--dtype must be float32, bfloat16 or float16, got {}",
                        other.name()
                    )));
                }
            },
        };
        let json = take_flag(args, "--json");
        if let Some(unknown) = args.first() {
            return Err(Error::value(format!("unknown argument {unknown}")));
        }
        let selection = select_backend_blocking(choice)?;
        let gpu = if selection.backend.info().kind == distopt::BackendKind::Gpu {
            distopt::GpuBackend::new_blocking().ok()
        } else {
            None
        };
        Ok(Config {
            gpu,
            ranks,
            elements,
            params,
            repeats,
            dtype,
            backend: selection.backend,
            reason: selection.reason,
            json,
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
        println!(
            "{}",
            json!({"bench": title, "backend": config.backend.info().name, "ranks": config.ranks, "dtype": config.dtype.name(),
                   "elements": config.elements, "copy_ms": copy * 1e3, "copy_gbps": copy_gbps,
                   "rows": rows, "extra": extra})
        );
        return;
    }
    println!(
        "distopt bench {title}: R = {}, N = {} {} elements per rank",
        config.ranks,
        config.elements,
        config.dtype.name()
    );
    println!(
        "backend: {} ({})",
        config.backend.info().name,
        config.reason
    );
    println!(
        "{:<28} {:>7} {:>10} {:>9} {:>9} {:>13} {:>9}",
        "kernel", "params", "median ms", "GB/s", "vs copy", "roofline GB/s", "vs roof"
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
        println!(
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
    println!(
        "{:<28} {:>7} {:>10.3} {:>9.2} {:>8}",
        "backend copy (same bytes)",
        "-",
        copy * 1e3,
        copy_gbps,
        "100%"
    );
    if !extra.is_null() {
        println!("{extra}");
    }
}

/// `distopt bench average`: all-reduce-mean of every parameter over the world.
pub fn average(args: &[String]) -> Result<(), Error> {
    let mut args = args.to_vec();
    let config = Config::parse(&mut args, 8, 1 << 22)?;
    let world = SimulatedWorld::new(config.ranks)?;
    let mut rows = Vec::new();
    for &params in &config.params {
        let mut replicas = model(&config.backend, config.ranks, config.elements, params)?;
        let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
            average_parameters(&world, &mut replicas, Subgroups::world(config.ranks), None)
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

/// `distopt bench optim`: one SGD-momentum and one Adam step on every rank.
pub fn optim(args: &[String]) -> Result<(), Error> {
    let mut args = args.to_vec();
    let config = Config::parse(&mut args, 8, 1 << 22)?;
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
        let mut sgd = Sgd::new(
            &replicas,
            SgdOptions {
                lr: 1e-3,
                momentum: 0.9,
                ..Default::default()
            },
        )?;
        sgd.step(&mut replicas)?; // creates the momentum buffers
        let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
            sgd.step(&mut replicas)
        })?;
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
        rows.push(Row {
            name: "SGD momentum".into(),
            params,
            seconds,
            bytes: 5.0 * base,
            roofline: roofline_seconds(&config, sgd_traffic, words)?,
        });
        let mut adam = Adam::new(&replicas, AdamOptions::defaults(false), false)?;
        adam.step(&mut replicas)?;
        let seconds = median_seconds(config.backend.as_ref(), config.repeats, || {
            adam.step(&mut replicas)
        })?;
        // Reads parameters, gradients, both moments; writes parameters and both moments.
        let adam_traffic = Traffic {
            read: 1,
            update: 3,
            write: 0,
        };
        rows.push(Row {
            name: "Adam".into(),
            params,
            seconds,
            bytes: 7.0 * base,
            roofline: roofline_seconds(&config, adam_traffic, words)?,
        });
    }
    // The copy moves the same bytes: a float32 arena of the parameters' size.
    let copy_elements = (config.elements * element_bytes).div_ceil(4);
    let copy = copy_seconds(&config, config.ranks, copy_elements)?;
    print(&config, "optim", &rows, copy, 2.0 * base, Value::Null);
    Ok(())
}

/// `distopt bench zero`: a ZeRO Adam step and the optimizer state per rank for W = 1, 2, 4, 8
/// over the same model.
pub fn zero(args: &[String]) -> Result<(), Error> {
    let mut args = args.to_vec();
    let worlds = match take_option(&mut args, "--worlds")? {
        Some(text) => text
            .split(',')
            .map(|w| count("--worlds", w.trim()))
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![1, 2, 4, 8],
    };
    if !args.iter().any(|a| a == "--params") {
        args.extend(["--params".to_string(), "100".to_string()]);
    }
    let config = Config::parse(&mut args, 1, 1 << 24)?;
    let params = config.params.first().copied().unwrap_or(100);
    let mut results = Vec::new();
    for &w in &worlds {
        let mut replicas = model(&config.backend, w, config.elements, params)?;
        let world: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(w)?);
        let groups = vec![((0..replicas.len()).collect::<Vec<_>>(), OptionMap::new())];
        let mut defaults = OptionMap::new();
        defaults.insert("lr".into(), 1e-3.into());
        let options = ZeroOptions {
            parameters_as_bucket_view: true,
            overlap_with_ddp: false,
        };
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
            zero.step(&mut replicas)
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
        println!(
            "{}",
            json!({"bench": "zero", "backend": config.backend.info().name, "elements": config.elements,
                   "params": params, "optimizer": "Adam", "unsharded_state_bytes": full_state, "worlds": results})
        );
        return Ok(());
    }
    println!(
        "distopt bench zero: Adam, {params} parameters, {} float32 elements",
        config.elements
    );
    println!(
        "backend: {} ({})",
        config.backend.info().name,
        config.reason
    );
    println!(
        "{:>3} {:>12} {:>16} {:>12} {:>18}",
        "W", "step ms", "state MiB/rank", "of full", "bcast MiB/rank"
    );
    for r in &results {
        let max = r["max_state_bytes_per_rank"].as_f64().unwrap_or(0.0);
        println!(
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
