//! `distopt bench step`: how fast the data-parallel SGD step runs, next to the fastest copies
//! of the same bytes the adapter and the host can make.
//!
//! Every row is timed `--repeats` times after one untimed warm-up and reported as the median.
//! Throughput counts the step's traffic, `(2R+2)·N·element bytes` (R gradients and the
//! rank-0 parameters read; R parameter copies and the means written); the copy rows move
//! `(R+1)·N·element bytes`, which is the same traffic (read + write).

use std::time::{Duration, Instant};

use distopt::backend::{BackendChoice, layout_params};
use distopt::{
    Arena, Backend, CpuBackend, DType, Error, GpuBackend, HostData, ReplicaOutputs, StorageFormat,
    Tensor,
};
use half::{bf16, f16};
use serde_json::{Value, json};

use crate::{USAGE, take_flag, take_option};

/// The step's learning rate: small, so that repeated steps keep the parameters finite.
const LEARNING_RATE: f32 = 1e-3;

/// `distopt bench ARGS`.
pub fn run(args: &[String]) -> Result<(), Error> {
    let mut args = args.to_vec();
    match args.first().map(String::as_str) {
        Some("step") => {
            args.remove(0);
        }
        Some("average") => return crate::bench_algorithms::average(&args[1..]),
        Some("optim") => return crate::bench_algorithms::optim(&args[1..]),
        Some("zero") => return crate::bench_algorithms::zero(&args[1..]),
        Some("all") => return crate::bench_all::run(&args[1..]),
        Some("comm") => {
            return Err(Error::value(if cfg!(feature = "mpi") {
                "bench comm measures MPI: run it under `mpirun -np W distopt bench comm`"
            } else {
                "bench comm needs the `mpi` feature: cargo build --release --features mpi, then `mpirun -np W distopt bench comm`"
            }));
        }
        Some(other) => {
            return Err(Error::value(format!(
                "unknown benchmark '{other}': expected step, average, optim, zero or all\n{USAGE}"
            )));
        }
        None => {
            return Err(Error::value(format!(
                "expected a benchmark: step, average, optim, zero or all\n{USAGE}"
            )));
        }
    }
    let config = Config::from_args(&mut args)?;
    let report = bench_step(&config)?;
    if config.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_table());
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
    fn from_args(args: &mut Vec<String>) -> Result<Config, Error> {
        let ranks = match take_option(args, "--ranks")? {
            Some(text) => parse_count("--ranks", &text)?,
            None => 4,
        };
        let elements = match take_option(args, "--elements")? {
            Some(text) => parse_count("--elements", &text)?,
            None => 1 << 22,
        };
        let dtype = match take_option(args, "--dtype")? {
            Some(text) => DType::parse(&text)?,
            None => DType::Float32,
        };
        if dtype == DType::Float64 {
            return Err(Error::value(
                "bench step: --dtype must be float32, float16 or bfloat16 (the step computes float64 \
                 parameters in float32 storage)",
            ));
        }
        let choice = BackendChoice::parse(
            &take_option(args, "--backend")?.unwrap_or_else(|| "auto".into()),
        )?;
        let repeats = match take_option(args, "--repeats")? {
            Some(text) => parse_count("--repeats", &text)?,
            None => 10,
        };
        let json = take_flag(args, "--json");
        if let Some(unknown) = args.first() {
            return Err(Error::value(format!(
                "bench step: unexpected argument {unknown}\n{USAGE}"
            )));
        }
        if ranks > u32::MAX as usize {
            return Err(Error::value("--ranks is too large"));
        }
        Ok(Config {
            ranks,
            elements,
            dtype,
            choice,
            repeats,
            json,
        })
    }

    fn format(&self) -> StorageFormat {
        self.dtype.storage()
    }

    fn element_bytes(&self) -> usize {
        self.format().element_bytes()
    }
}

/// A positive count: `4194304`, `2^22` or `1<<22`.
pub(crate) fn parse_count(name: &str, text: &str) -> Result<usize, Error> {
    let bad = || {
        Error::value(format!(
            "{name}: expected a positive integer such as 4194304 or 2^22, got '{text}'"
        ))
    };
    let int = |s: &str| {
        s.trim()
            .replace('_', "")
            .parse::<usize>()
            .map_err(|_| bad())
    };
    let value = if let Some((base, exp)) = text.split_once('^') {
        let exp = u32::try_from(int(exp)?).map_err(|_| bad())?;
        int(base)?.checked_pow(exp).ok_or_else(bad)?
    } else if let Some((base, shift)) = text.split_once("<<") {
        let shift = u32::try_from(int(shift)?).map_err(|_| bad())?;
        int(base)?
            .checked_mul(1usize.checked_shl(shift).ok_or_else(bad)?)
            .ok_or_else(bad)?
    } else {
        int(text)?
    };
    if value == 0 {
        return Err(bad());
    }
    Ok(value)
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

/// Deterministic values in [-1, 1): a splitmix64 stream per seed.
fn values(seed: u64, n: usize) -> Result<Vec<f32>, Error> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| Error::value(format!("not enough memory for {n} elements")))?;
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    out.extend((0..n).map(|_| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }));
    Ok(out)
}

/// `values` as a host tensor of `dtype`.
fn tensor(dtype: DType, values: Vec<f32>) -> Result<Tensor, Error> {
    let n = values.len();
    let data = match dtype {
        DType::Float16 => HostData::Float16(values.into_iter().map(f16::from_f32).collect()),
        DType::BFloat16 => HostData::BFloat16(values.into_iter().map(bf16::from_f32).collect()),
        _ => HostData::Float32(values),
    };
    Tensor::new(&[n], data)
}

/// `values` packed in `format`, padded with zeros to `rank_len` elements.
fn pack(format: StorageFormat, values: &[f32], rank_len: usize) -> Vec<u32> {
    let mut words = vec![0u32; format.words_for(rank_len)];
    for (i, &v) in values.iter().enumerate() {
        format.store(&mut words, i, v);
    }
    words
}

/// The shared seeds: rank r's gradients use seed r + 1, the parameters seed 0.
fn fill_step_arenas(
    config: &Config,
    rank_len: usize,
    params: &mut Arena,
    grads: &mut Arena,
) -> Result<(), Error> {
    let format = config.format();
    let words = pack(format, &values(0, config.elements)?, rank_len);
    for rank in 0..config.ranks {
        params.write(rank, 0, &words)?;
    }
    drop(words);
    for rank in 0..config.ranks {
        let words = pack(format, &values(rank as u64 + 1, config.elements)?, rank_len);
        grads.write(rank, 0, &words)?;
    }
    Ok(())
}

/// (a) and the CPU resident row: arenas filled once, then the step and a synchronize.
fn time_resident(config: &Config, backend: &dyn Backend) -> Result<Row, Error> {
    let (_, rank_len) = layout_params(&[config.elements]);
    let ranks = config.ranks;
    let chunk_len = backend.chunk_len(rank_len, ranks);
    let format = config.format();
    let mut params = backend.create_arena(format, ranks, rank_len, chunk_len)?;
    let mut grads = backend.create_arena(format, ranks, rank_len, chunk_len)?;
    let mut means = backend.create_arena(format, 1, rank_len, chunk_len)?;
    fill_step_arenas(config, rank_len, &mut params, &mut grads)?;
    pollster::block_on(backend.synchronize())?;
    median(config.repeats, || {
        let start = Instant::now();
        backend.dp_sgd_step(&mut params, &grads, &mut means, LEARNING_RATE)?;
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
    let words = pack(format, &values(0, config.elements)?, rank_len);
    for rank in 0..ranks {
        src.write(rank, 0, &words)?;
        dst.write(rank, 0, &words)?;
    }
    drop(words);
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

/// Refuses sizes whose one-shot rows would not fit in the memory the host has available
/// (natively the allocator aborts the process instead of failing).
fn check_memory(ranks: usize, n: usize, elem: usize) -> Result<(), Error> {
    // The host tensors (2R·N), the one-shot step's arenas ((2R+1)·N), its packing images and
    // host copies, and its outputs (R+3)·N: about (5R+6)·N elements at the peak.
    let needed = (5 * ranks as u128 + 6) * n as u128 * elem as u128;
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("MemAvailable:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u128>()
                        .ok()
                })
        })
        .map(|kib| kib * 1024);
    let limit = available.unwrap_or(u128::from(u64::MAX));
    if needed > limit {
        return Err(Error::value(format!(
            "bench step: R = {ranks}, N = {n} needs about {:.1} GB of memory, {:.1} GB is available",
            needed as f64 / 1e9,
            limit as f64 / 1e9
        )));
    }
    Ok(())
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
        BackendChoice::Auto | BackendChoice::Gpu => match GpuBackend::new_blocking() {
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
    let param = tensor(config.dtype, values(0, n)?)?;
    let params: Vec<Vec<Tensor>> = (0..ranks).map(|_| vec![param.clone()]).collect();
    drop(param);
    let grads = (0..ranks)
        .map(|r| Ok(vec![Some(tensor(config.dtype, values(r as u64 + 1, n)?)?)]))
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
        let _ = writeln!(
            out,
            "  (a)/(d)  resident step vs adapter copy    {}",
            judged(a_d, Some(0.8))
        );
        let _ = writeln!(
            out,
            "  (b)/(a)  one-shot vs resident step        {}",
            judged(b_a, None)
        );
        let _ = writeln!(
            out,
            "  (c)/(e)  CPU one-shot vs host memcpy      {}",
            judged(c_e, Some(0.7))
        );
        let _ = writeln!(
            out,
            "           CPU kernel vs host memcpy        {}",
            judged(k_e, None)
        );
        out
    }
}
