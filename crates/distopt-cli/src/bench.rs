//! `distopt bench step`: how fast the data-parallel SGD step runs, next to the fastest copies
//! of the same bytes the adapter and the host can make.
//!
//! Every row is timed `--repeats` times after one untimed warm-up and reported as the median.
//! Throughput counts the step's traffic, `(2R+2)·N·element bytes` (R gradients and the
//! rank-0 parameters read; R parameter copies and the means written); the copy rows move
//! `(R+1)·N·element bytes`, which is the same traffic (read + write).

use crate::output::{out, outln};
use std::time::{Duration, Instant};

use distopt::BlockOn;
use distopt::backend::{BackendChoice, layout_params};
use distopt::bench::{self, LEARNING_RATE, ResidentStep};
use distopt::{
    Backend, CpuBackend, DType, Error, GpuBackend, ReplicaOutputs, StorageFormat, Tensor,
};
use serde_json::{Value, json};

use crate::args::{Bench, BenchStepArgs};

/// `distopt bench …`.
pub fn run(which: Bench) -> Result<(), Error> {
    let args = match which {
        Bench::Step(args) => args,
        Bench::Average(args) => return crate::bench_algorithms::average(args),
        Bench::Optim(args) => return crate::bench_algorithms::optim(args),
        Bench::Zero(args) => return crate::bench_algorithms::zero(args),
        Bench::All(args) => return crate::bench_all::run(args),
        #[cfg(feature = "nats")]
        Bench::Comm(args) if args.world.world.is_some() => {
            let world = crate::world::join_nats(&args.world, args.ranks)?;
            let peer = world.raw_peer()?;
            let raw = crate::bench_comm::Nats {
                world: &world,
                peer,
            };
            return crate::bench_comm::run(args, world.clone(), &raw);
        }
        #[cfg(feature = "nats")]
        Bench::Recovery(args) => return crate::bench_recovery::run(&args),
        #[cfg(feature = "nats")]
        Bench::Overlap(args) => {
            let world = crate::world::join_nats(&args.world, Some(args.ranks))?;
            return crate::bench_overlap::run(args, world);
        }
        #[cfg(not(feature = "nats"))]
        Bench::Overlap(_) => {
            return Err(Error::value(
                "bench overlap needs the `nats` feature: cargo build --release --features nats",
            ));
        }
        #[cfg(not(feature = "nats"))]
        Bench::Recovery(_) => {
            return Err(Error::value(
                "bench recovery needs the `nats` feature: cargo build --release --features nats",
            ));
        }
        Bench::Comm(_) => {
            return Err(Error::value(if cfg!(feature = "mpi") {
                "bench comm measures MPI or NATS: run it under `mpirun -np W distopt bench comm`, or W times with --world nats://HOST:PORT --run NAME --ranks W"
            } else {
                "bench comm needs the `mpi` feature: cargo build --release --features mpi, then `mpirun -np W distopt bench comm`"
            }));
        }
    };
    let config = Config::from_args(args)?;
    let report = bench_step(&config)?;
    if config.json {
        outln!("{}", report.to_json());
    } else {
        out!("{}", report.to_table());
    }
    Ok(())
}

struct Config {
    ranks: usize,
    elements: usize,
    dtype: DType,
    choice: BackendChoice,
    repeats: usize,
    json: bool,
}

impl Config {
    fn from_args(args: BenchStepArgs) -> Result<Config, Error> {
        if args.dtype == DType::Float64 {
            return Err(Error::value(
                "bench step: --dtype must be float32, float16 or bfloat16 (the step computes float64 \
                 parameters in float32 storage)",
            ));
        }
        if args.ranks > u32::MAX as usize {
            return Err(Error::value("--ranks is too large"));
        }
        Ok(Config {
            ranks: args.ranks,
            elements: args.elements,
            dtype: args.dtype,
            choice: args.backend,
            repeats: args.repeats,
            json: args.json,
        })
    }

    fn format(&self) -> StorageFormat {
        self.dtype.storage()
    }

    fn element_bytes(&self) -> usize {
        self.format().element_bytes()
    }
}

/// One timed row: the median time, or why it was not measured.
#[derive(Clone)]
enum Row {
    Measured { median: Duration },
    Unavailable,
}

impl Row {
    fn ms(&self) -> Option<f64> {
        match self {
            Row::Measured { median } => Some(median.as_secs_f64() * 1e3),
            Row::Unavailable => None,
        }
    }

    fn gbps(&self, bytes: u64) -> Option<f64> {
        match self {
            Row::Measured { median } if !median.is_zero() => {
                Some(bytes as f64 / median.as_secs_f64() / 1e9)
            }
            Row::Measured { .. } => Some(f64::INFINITY),
            Row::Unavailable => None,
        }
    }
}

struct Report {
    ranks: usize,
    elements: usize,
    dtype: DType,
    element_bytes: usize,
    repeats: usize,
    /// `(2R+2)·N·element bytes`.
    bytes: u64,
    backend: &'static str,
    /// The adapter's name, API and device type, when the GPU side ran.
    adapter: Option<(String, String, String, bool)>,
    /// Why the GPU rows are missing.
    gpu_unavailable: Option<String>,
    /// Set when `--backend auto` found only a software adapter: `distopt step --backend auto`
    /// would run on the CPU backend there (the GPU rows still measure the adapter).
    auto_note: Option<String>,
    cpu_threads: usize,
    resident: Row,
    oneshot: Row,
    /// (c): the CPU one-shot step writing R separate replicas.
    cpu: Row,
    /// The CPU one-shot step with the R replicas sharing one buffer.
    cpu_shared: Row,
    cpu_resident: Row,
    copy: Row,
    memcpy: Row,
    cpu_copy: Row,
    /// The same-traffic roofline of the CPU step.
    cpu_roofline: Row,
    /// The GPU roofline: a copy shader with the kernels' access pattern.
    shader_copy: Row,
}

/// The median of `repeats` timings of `once` after one untimed warm-up; `once` returns the
/// time of the part it means to measure.
fn median(repeats: usize, mut once: impl FnMut() -> Result<Duration, Error>) -> Result<Row, Error> {
    once()?;
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        times.push(once()?);
    }
    times.sort();
    let mid = times.len() / 2;
    let median = if times.len().is_multiple_of(2) {
        (times[mid - 1] + times[mid]) / 2
    } else {
        times[mid]
    };
    Ok(Row::Measured { median })
}

/// (a) and the CPU resident row: the library's resident step workload, then the step and a
/// synchronize.
fn time_resident(config: &Config, backend: &dyn Backend) -> Result<Row, Error> {
    let mut bench = ResidentStep::new(backend, config.ranks, config.elements, config.dtype)?;
    pollster::block_on(backend.synchronize())?;
    median(config.repeats, || {
        let start = Instant::now();
        bench.step(backend)?;
        pollster::block_on(backend.synchronize())?;
        Ok(start.elapsed())
    })
}

/// (d) and the CPU copy row: one arena of R+1 ranks copied into another.
fn time_copy(config: &Config, backend: &dyn Backend) -> Result<Row, Error> {
    let (_, rank_len) = layout_params(&[config.elements]);
    let ranks = config.ranks + 1;
    let chunk_len = backend.chunk_len(rank_len, ranks);
    let format = config.format();
    let mut src = backend.create_arena(format, ranks, rank_len, chunk_len)?;
    let mut dst = backend.create_arena(format, ranks, rank_len, chunk_len)?;
    bench::fill_rows(&mut src, config.dtype, config.elements, |_| 0, 0..ranks)?;
    bench::fill_rows(&mut dst, config.dtype, config.elements, |_| 0, 0..ranks)?;
    pollster::block_on(backend.synchronize())?;
    median(config.repeats, || {
        let start = Instant::now();
        backend.copy_arena(&src, &mut dst)?;
        pollster::block_on(backend.synchronize())?;
        Ok(start.elapsed())
    })
}

/// The GPU roofline: a compute shader with the kernels' access pattern copying float32 arenas of
/// (R+1)·N·element bytes (the step's traffic, read + write).
fn time_shader_copy(config: &Config, gpu: &GpuBackend) -> Result<Row, Error> {
    let elements = (config.element_bytes() * config.elements).div_ceil(4);
    let (_, rank_len) = layout_params(&[elements]);
    let ranks = config.ranks + 1;
    let chunk_len = gpu.chunk_len(rank_len, ranks);
    let src = gpu.create_arena(StorageFormat::F32, ranks, rank_len, chunk_len)?;
    let mut dst = gpu.create_arena(StorageFormat::F32, ranks, rank_len, chunk_len)?;
    gpu.shader_copy(&src, &mut dst)?;
    pollster::block_on(gpu.synchronize())?;
    median(config.repeats, || {
        let start = Instant::now();
        gpu.shader_copy(&src, &mut dst)?;
        pollster::block_on(gpu.synchronize())?;
        Ok(start.elapsed())
    })
}

/// The CPU step's same-traffic roofline: R + 1 arrays of N elements read (the gradients and
/// the parameter), R + 1 written (the replicas and the mean), no arithmetic, on all threads.
fn time_roofline(config: &Config, threads: usize) -> Result<Row, Error> {
    let words = config.format().words_for(config.elements);
    let mut roof = distopt::backend::roofline::SameTraffic::new(
        threads,
        config.ranks + 1,
        0,
        config.ranks + 1,
        words,
    )?;
    median(config.repeats, || {
        let start = Instant::now();
        roof.run()?;
        Ok(start.elapsed())
    })
}

/// (b) and (c): `sgd_step` from host tensors to host tensors (the output is dropped outside
/// the timed part), the updated replicas as R separate buffers or one shared buffer.
fn time_oneshot(
    config: &Config,
    backend: &dyn Backend,
    params: &[Vec<Tensor>],
    grads: &[Vec<Option<Tensor>>],
    replicas: ReplicaOutputs,
) -> Result<Row, Error> {
    median(config.repeats, || {
        let start = Instant::now();
        let out = pollster::block_on(distopt::sgd_step_with(
            backend,
            params,
            grads,
            f64::from(LEARNING_RATE),
            replicas,
        ))?;
        let elapsed = start.elapsed();
        drop(out);
        Ok(elapsed)
    })
}

/// (e): one `memcpy` of (R+1)·N·element bytes between two buffers already in memory.
fn time_memcpy(config: &Config, bytes: usize) -> Result<Row, Error> {
    let alloc = |fill: u8| -> Result<Vec<u8>, Error> {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes)
            .map_err(|_| Error::value(format!("not enough memory for {bytes} bytes")))?;
        v.resize(bytes, fill);
        Ok(v)
    };
    let src = alloc(0x5a)?;
    let mut dst = alloc(0)?;
    median(config.repeats, || {
        let start = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        Ok(start.elapsed())
    })
}

/// Refuses sizes whose rows would not fit the memory budget ([`distopt::budget`]) before
/// anything is allocated: a clear error instead of an abort or the machine swapping.
fn check_memory(ranks: usize, n: usize, elem: usize) -> Result<(), Error> {
    // The host tensors (2R·N), the one-shot step's arenas ((2R+1)·N), its packing images and
    // host copies, and its outputs (R+3)·N: about (5R+6)·N elements at the peak.
    let what = format!("bench step with R = {ranks}, N = {n}");
    let needed = ranks
        .checked_mul(5)
        .and_then(|r| r.checked_add(6))
        .and_then(|r| r.checked_mul(n))
        .and_then(|x| x.checked_mul(elem))
        .ok_or_else(|| {
            Error::runtime(format!(
                "not enough memory for {what}: the sizes overflow the address space"
            ))
        })?;
    distopt::budget::check(needed, &what)
}

fn bench_step(config: &Config) -> Result<Report, Error> {
    let (ranks, n, elem) = (config.ranks, config.elements, config.element_bytes());
    let too_large = || Error::value("bench step: --ranks × --elements is too large");
    let copy_bytes = (ranks + 1)
        .checked_mul(n)
        .and_then(|x| x.checked_mul(elem))
        .ok_or_else(too_large)?;
    let bytes = copy_bytes.checked_mul(2).ok_or_else(too_large)? as u64;
    check_memory(ranks, n, elem)?;

    let (gpu, gpu_unavailable, backend) = match config.choice {
        BackendChoice::Cpu => (
            None,
            Some("--backend cpu: the GPU rows were skipped".to_string()),
            "cpu",
        ),
        BackendChoice::Auto | BackendChoice::Gpu => match GpuBackend::new().block_on() {
            Ok(gpu) => (Some(gpu), None, "gpu"),
            Err(err) => (None, Some(err.message().to_string()), "cpu"),
        },
    };
    let adapter = gpu.as_ref().map(|g| {
        let i = g.info();
        (
            i.name.clone(),
            i.api.clone(),
            i.device_type.clone(),
            i.mappable_primary_buffers,
        )
    });
    let auto_note = match (&config.choice, &adapter) {
        (BackendChoice::Auto, Some((name, _, device_type, _))) if device_type == "Cpu" => {
            Some(format!(
                "{name} is a software adapter: `--backend auto` runs the step itself on the CPU \
                 backend here; the GPU rows measure the adapter anyway"
            ))
        }
        _ => None,
    };
    let cpu = CpuBackend::new();

    let (mut resident, mut copy, mut oneshot, mut shader_copy) = (
        Row::Unavailable,
        Row::Unavailable,
        Row::Unavailable,
        Row::Unavailable,
    );
    if let Some(gpu) = &gpu {
        resident = time_resident(config, gpu)?;
        copy = time_copy(config, gpu)?;
        shader_copy = time_shader_copy(config, gpu)?;
    }
    let cpu_resident = time_resident(config, &cpu)?;
    let cpu_copy = time_copy(config, &cpu)?;
    let cpu_roofline = time_roofline(config, cpu.info().threads)?;
    let memcpy = time_memcpy(config, copy_bytes)?;

    // Host tensors for the one-shot rows: the replicas of one parameter (every rank holds the
    // same values, as in data-parallel training) and R different gradients.
    let param = bench::tensor(config.dtype, 0, n)?;
    let params: Vec<Vec<Tensor>> = (0..ranks).map(|_| vec![param.clone()]).collect();
    drop(param);
    let grads = (0..ranks)
        .map(|r| Ok(vec![Some(bench::tensor(config.dtype, r as u64 + 1, n)?)]))
        .collect::<Result<Vec<_>, Error>>()?;
    if let Some(gpu) = &gpu {
        oneshot = time_oneshot(config, gpu, &params, &grads, ReplicaOutputs::Separate)?;
    }
    let cpu_oneshot = time_oneshot(config, &cpu, &params, &grads, ReplicaOutputs::Separate)?;
    let cpu_shared = time_oneshot(config, &cpu, &params, &grads, ReplicaOutputs::Shared)?;

    Ok(Report {
        ranks,
        elements: n,
        dtype: config.dtype,
        element_bytes: elem,
        repeats: config.repeats,
        bytes,
        backend,
        adapter,
        gpu_unavailable,
        auto_note,
        cpu_threads: cpu.info().threads,
        resident,
        oneshot,
        cpu: cpu_oneshot,
        cpu_shared,
        cpu_resident,
        copy,
        memcpy,
        cpu_copy,
        cpu_roofline,
        shader_copy,
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && b.is_finite() && a.is_finite() => Some(a / b),
        _ => None,
    }
}

fn round(x: Option<f64>, digits: i32) -> Value {
    match x {
        Some(x) if x.is_finite() => {
            let scale = 10f64.powi(digits);
            json!((x * scale).round() / scale)
        }
        _ => Value::Null,
    }
}

/// `2^k` when `n` is a power of two above 1, else nothing.
fn power_of_two(n: usize) -> Option<u32> {
    (n.is_power_of_two() && n > 1).then(|| n.trailing_zeros())
}

impl Report {
    fn gbps(&self, row: &Row) -> Option<f64> {
        row.gbps(self.bytes)
    }

    /// The throughput ratios (a)/(d), (b)/(a), (c)/(e) and the CPU kernel's against (e).
    fn ratios(&self) -> [Option<f64>; 4] {
        [
            ratio(self.gbps(&self.resident), self.gbps(&self.copy)),
            ratio(self.gbps(&self.oneshot), self.gbps(&self.resident)),
            ratio(self.gbps(&self.cpu), self.gbps(&self.memcpy)),
            ratio(self.gbps(&self.cpu_resident), self.gbps(&self.memcpy)),
        ]
    }

    fn to_json(&self) -> Value {
        let [
            resident_vs_copy,
            oneshot_vs_resident,
            cpu_vs_memcpy,
            cpu_resident_vs_memcpy,
        ] = self.ratios();
        let row = |r: &Row| (round(r.ms(), 4), round(self.gbps(r), 3));
        let (resident_ms, resident_gbps) = row(&self.resident);
        let (oneshot_ms, oneshot_gbps) = row(&self.oneshot);
        let (cpu_ms, cpu_gbps) = row(&self.cpu);
        let (cpu_shared_ms, cpu_shared_gbps) = row(&self.cpu_shared);
        let (cpu_resident_ms, cpu_resident_gbps) = row(&self.cpu_resident);
        let (copy_ms, copy_gbps) = row(&self.copy);
        let (memcpy_ms, memcpy_gbps) = row(&self.memcpy);
        let (cpu_copy_ms, cpu_copy_gbps) = row(&self.cpu_copy);
        let (cpu_roofline_ms, cpu_roofline_gbps) = row(&self.cpu_roofline);
        let (shader_copy_ms, shader_copy_gbps) = row(&self.shader_copy);
        let vs_roofline = |r: &Row| round(ratio(self.gbps(r), self.gbps(&self.cpu_roofline)), 3);
        let adapter = self.adapter.as_ref();
        let mut out = json!({
            "benchmark": "step",
            "ranks": self.ranks,
            "elements": self.elements,
            "dtype": self.dtype.name(),
            "element_bytes": self.element_bytes,
            "repeats": self.repeats,
            "bytes": self.bytes,
            "copy_bytes": self.bytes / 2,
            "backend": self.backend,
            "adapter": adapter.map(|a| a.0.clone()),
            "adapter_api": adapter.map(|a| a.1.clone()),
            "adapter_device_type": adapter.map(|a| a.2.clone()),
            "mappable_primary_buffers": adapter.map(|a| a.3),
            "gpu_unavailable": self.gpu_unavailable,
            "auto_picks_cpu": self.auto_note.is_some(),
            "cpu_threads": self.cpu_threads,
            "resident_ms": resident_ms,
            "resident_gbps": resident_gbps,
            "oneshot_ms": oneshot_ms,
            "oneshot_gbps": oneshot_gbps,
            "cpu_ms": cpu_ms,
            "cpu_gbps": cpu_gbps,
            "cpu_shared_ms": cpu_shared_ms,
            "cpu_shared_gbps": cpu_shared_gbps,
            "cpu_resident_ms": cpu_resident_ms,
            "cpu_resident_gbps": cpu_resident_gbps,
            "copy_ms": copy_ms,
            "copy_gbps": copy_gbps,
            "memcpy_ms": memcpy_ms,
            "memcpy_gbps": memcpy_gbps,
            "cpu_copy_ms": cpu_copy_ms,
            "cpu_copy_gbps": cpu_copy_gbps,
            "resident_vs_copy": round(resident_vs_copy, 3),
            "oneshot_vs_resident": round(oneshot_vs_resident, 3),
            "cpu_vs_memcpy": round(cpu_vs_memcpy, 3),
            "cpu_resident_vs_memcpy": round(cpu_resident_vs_memcpy, 3),
        });
        let rooflines = json!({
            "shader_copy_ms": shader_copy_ms,
            "shader_copy_gbps": shader_copy_gbps,
            "resident_vs_shader_copy": round(ratio(self.gbps(&self.resident), self.gbps(&self.shader_copy)), 3),
            "oneshot_vs_shader_copy": round(ratio(self.gbps(&self.oneshot), self.gbps(&self.shader_copy)), 3),
            "cpu_roofline_ms": cpu_roofline_ms,
            "cpu_roofline_gbps": cpu_roofline_gbps,
            "cpu_vs_roofline": vs_roofline(&self.cpu),
            "cpu_shared_vs_roofline": vs_roofline(&self.cpu_shared),
            "cpu_resident_vs_roofline": vs_roofline(&self.cpu_resident),
        });
        if let (Some(out), Value::Object(more)) = (out.as_object_mut(), rooflines) {
            out.extend(more);
        }
        out
    }

    fn to_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let n = match power_of_two(self.elements) {
            Some(k) => format!("{} (2^{k})", self.elements),
            None => self.elements.to_string(),
        };
        let _ = writeln!(
            out,
            "distopt bench step: R = {} ranks, N = {n} elements, {}, median of {} runs",
            self.ranks,
            self.dtype.name(),
            self.repeats
        );
        match (&self.adapter, &self.gpu_unavailable) {
            (Some((name, api, device_type, mappable)), _) => {
                let _ = writeln!(
                    out,
                    "GPU adapter: {name} ({api}, {device_type}; mappable primary buffers: {})",
                    if *mappable { "yes" } else { "no" }
                );
            }
            (None, Some(reason)) => {
                let _ = writeln!(out, "GPU rows unavailable: {reason}");
            }
            (None, None) => {}
        }
        if let Some(note) = &self.auto_note {
            let _ = writeln!(out, "note: {note}");
        }
        let _ = writeln!(out, "CPU backend: {} threads", self.cpu_threads);
        let _ = writeln!(
            out,
            "bytes per step: (2R+2)·N·{} = {} ({:.1} MB); copies move (R+1)·N·{} = {:.1} MB, \
             i.e. the same (2R+2)·N·{} bytes of traffic (read + write)",
            self.element_bytes,
            self.bytes,
            self.bytes as f64 / 1e6,
            self.element_bytes,
            self.bytes as f64 / 2e6,
            self.element_bytes,
        );
        let _ = writeln!(out);
        let rows: [(&str, &str, &Row); 10] = [
            ("(a)", "GPU step, resident", &self.resident),
            ("(b)", "GPU step, one-shot from host tensors", &self.oneshot),
            ("(c)", "CPU step, one-shot, R replica buffers", &self.cpu),
            ("", "CPU step, one-shot, shared replicas", &self.cpu_shared),
            ("", "CPU step, resident kernel only", &self.cpu_resident),
            ("(d)", "GPU buffer-to-buffer copy", &self.copy),
            ("", "GPU shader copy (kernels' access)", &self.shader_copy),
            ("(e)", "host memcpy (one thread)", &self.memcpy),
            ("", "host copy (CPU backend, all threads)", &self.cpu_copy),
            ("", "CPU same-traffic roofline", &self.cpu_roofline),
        ];
        let _ = writeln!(
            out,
            "{:<3} {:<38} {:>11} {:>9}",
            "", "", "median ms", "GB/s"
        );
        for (tag, label, row) in rows {
            let (ms, gbps) = match (row.ms(), self.gbps(row)) {
                (Some(ms), Some(gbps)) => (format!("{ms:.3}"), format!("{gbps:.2}")),
                _ => ("-".into(), "-".into()),
            };
            let _ = writeln!(out, "{tag:<3} {label:<38} {ms:>11} {gbps:>9}");
        }
        let _ = writeln!(out);
        let [a_d, b_a, c_e, k_e] = self.ratios();
        let judged = |value: Option<f64>, target: Option<f64>| match (value, target) {
            (Some(v), Some(t)) => format!(
                "{v:.2}  (target >= {t:.2}: {})",
                if v >= t { "met" } else { "NOT met" }
            ),
            (Some(v), None) => format!("{v:.2}"),
            (None, _) => "-".into(),
        };
        let _ = writeln!(out, "throughput ratios:");
        let ratios = [
            ("(a)/(d)  resident step vs adapter copy", a_d, Some(0.8)),
            ("(b)/(a)  one-shot vs resident step", b_a, None),
            ("(c)/(e)  CPU one-shot vs host memcpy", c_e, Some(0.7)),
            ("         CPU kernel vs host memcpy", k_e, None),
        ];
        for (what, value, target) in ratios {
            let _ = writeln!(out, "  {what:<42}{}", judged(value, target));
        }
        out
    }
}
