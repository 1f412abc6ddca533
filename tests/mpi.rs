//! One rank per process over MPI (`cargo test --features mpi`).
//!
//! This binary is both the launcher and the ranks. Run by cargo, it starts `mpirun -np W` on
//! itself (with `DISTOPT_MPI_WORKER` set) and checks what the ranks report:
//!
//! - golden replays: every case of the multi-process kinds (periodic_averager,
//!   hierarchical_averager, post_local_sgd, zero_trajectory, zero_errors, zero_join, diloco,
//!   streaming_diloco)
//!   at its own world size W (2, 3, 4 and 8), and the dp_sgd_step cases with one rank per
//!   replica (`sgd_step_in`), one rank per process, each rank checking its own results against
//!   the case (zero_join: a rank out of inputs runs the join context's shadow iterations until
//!   the others finish), on the CPU backend and on the GPU backend (the step's arithmetic seen
//!   running in that backend's kernel, on its own arenas); a part that cannot run with one
//!   rank per process (a ZeRO reload into another world size) is counted and printed as
//!   skipped, never as passed;
//! - the command line: `mpirun -np 4 distopt train` reports what the simulated run of the
//!   same flags reports (losses, divergence, all-reduce bytes), `--ranks` contradicting the
//!   world fails on every rank, and `mpirun -np 2 distopt bench comm` measures;
//! - failures: a rank that panics or fails inside a collective ends the whole job in seconds
//!   with its message; a configuration the world size contradicts fails on every rank with the
//!   same error before any collective.
//!
//! Every `mpirun` runs under a deadline, so a hang fails this test instead of stalling CI.

mod common;
#[allow(dead_code)]
mod runners;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Case, load_cases};
use distopt::BlockOn;
use distopt::averaging::{HierarchicalModelAverager, ModelAverager, PeriodicModelAverager};
use distopt::backend::kernels::{
    AdamArenas, AdamScalars, AverageArgs, ConvertArgs, LerpArgs, ParamStarts, ScaledSumArgs,
    SgdArgs,
};
use distopt::backend::{BoxFuture, CopyRegion};
use distopt::comm::Communicator;
use distopt::comm::mpi::{MpiWorld, install_panic_hook};
use distopt::replicas::Replicas;
use distopt::step::step_request_from_json;
use distopt::{
    Arena, Backend, BackendInfo, BackendKind, CpuBackend, StorageFormat, Tensor, sgd_step_in,
};

const WORKER: &str = "DISTOPT_MPI_WORKER";
const BACKEND: &str = "DISTOPT_MPI_BACKEND";
const KINDS: [&str; 9] = [
    "diloco",
    "streaming_diloco",
    "dp_sgd_step",
    "periodic_averager",
    "hierarchical_averager",
    "post_local_sgd",
    "zero_trajectory",
    "zero_errors",
    "zero_join",
];
const GOLDEN_DEADLINE: Duration = Duration::from_secs(300);
const FAILURE_DEADLINE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    match std::env::var(WORKER) {
        Ok(role) => worker(&role),
        Err(_) => launcher(),
    }
}

// ---------------------------------------------------------------------------------------------
// The ranks

fn worker(role: &str) -> ExitCode {
    let world = match MpiWorld::initialize() {
        Ok(world) => world,
        Err(err) => {
            eprintln!("MPI initialization failed: {err}");
            return ExitCode::FAILURE;
        }
    };
    install_panic_hook(&world);
    let result = match role {
        "golden" => golden_worker(&world),
        "panic" => failing_worker(&world, true),
        "error" => failing_worker(&world, false),
        "bad-hierarchy" => bad_hierarchy_worker(&world),
        "zero-vs-simulated" => zero_vs_simulated(&world),
        other => Err(format!("unknown worker role {other}")),
    };
    match result {
        Ok(()) => {
            // Finalize before exiting: every rank got here.
            drop(world);
            ExitCode::SUCCESS
        }
        Err(message) => world.abort_with(&message, 1),
    }
}

fn backend() -> Result<Arc<dyn Backend>, String> {
    match std::env::var(BACKEND).as_deref() {
        Ok("gpu") => common::gpu_backend().ok_or_else(|| "no GPU adapter".to_string()),
        _ => Ok(Arc::new(CpuBackend::with_threads(1))),
    }
}

/// Replays every case of this world's size; a failing case ends the job (the other ranks
/// would otherwise wait in the next collective). A case a part of which cannot run with one
/// rank per process (a ZeRO reload into another world size) is counted as skipped in part,
/// never as passed.
fn golden_worker(world: &Arc<MpiWorld>) -> Result<(), String> {
    let backend = backend()?;
    let recording = Recording::new(backend.clone());
    let size = world.world_size();
    let comm: Arc<dyn Communicator> = world.clone();
    let factory = move |w: usize| -> Result<Arc<dyn Communicator>, String> {
        if w == size {
            Ok(comm.clone())
        } else {
            Err(format!("an MPI world of {size} cannot run a world of {w}"))
        }
    };
    let mut passed = 0;
    let mut exact = 0;
    let mut skipped = Vec::new();
    runners::take_skipped_parts();
    for case in cases_of_size(size) {
        let outcome = match case.kind.as_str() {
            "periodic_averager" | "hierarchical_averager" => {
                runners::averagers::run(&backend, &case, &factory)
            }
            "post_local_sgd" => runners::post_local_sgd::run(&backend, &case, &factory),
            "diloco" => runners::diloco::run(&backend, &case, &factory),
            "streaming_diloco" => runners::streaming_diloco::run(&backend, &case, &factory),
            "dp_sgd_step" => dp_sgd_step(world, &recording, &case),
            _ => runners::zero::run_with_world(&backend, &case, &factory),
        };
        let parts = runners::take_skipped_parts();
        match outcome {
            Ok(bit_exact) if parts.is_empty() => {
                passed += 1;
                exact += usize::from(bit_exact);
            }
            Ok(_) => skipped.push(format!("{}: {}", case.name, parts.join("; "))),
            Err(message) => return Err(format!("{} {}: {message}", case.kind, case.name)),
        }
    }
    println!(
        "rank {} of {size}: {passed} passed ({exact} bit-exact), {} skipped in part [{}]; {} dp_sgd_step cases ran on the {} backend's kernel",
        world.rank(),
        skipped.len(),
        skipped.join(" | "),
        recording.verified_cases(),
        kind_label(backend.as_ref()),
    );
    Ok(())
}

/// "gpu" or "cpu".
fn kind_label(backend: &dyn Backend) -> &'static str {
    match backend.info().kind {
        BackendKind::Gpu => "gpu",
        BackendKind::Cpu => "cpu",
    }
}

/// A `dp_sgd_step` case with one process per replica: each passes its own rank's lists to
/// `sgd_step_in` and checks the mean gradients and its updated replica, and that the step's
/// arithmetic ran in the backend's kernel, on the backend's own arenas (on the GPU for the
/// GPU backend), not on the host.
fn dp_sgd_step(world: &Arc<MpiWorld>, backend: &Recording, case: &Case) -> runners::Outcome {
    let rank = world.rank();
    let expected = case.expected();
    backend.take_runs();
    // Every process parses the whole request, so a malformed one fails everywhere alike.
    let result = step_request_from_json(case.input()).and_then(|request| {
        sgd_step_in(
            world.as_ref(),
            backend,
            &request.parameter_replicas[rank..rank + 1],
            &request.gradient_replicas[rank..rank + 1],
            request.learning_rate,
        )
        .block_on()
    });
    if expected.get("error").is_some() {
        return match result {
            Ok(_) => Err("expected an error, the step succeeded".into()),
            Err(err) => common::compare_error(case, &err).map(|()| true),
        };
    }
    let output = result.map_err(|e| format!("unexpected error: {e}"))?;
    let mut exact = runners::compare_tensors(
        case,
        &output.mean_gradients,
        &expected["mean_gradients"],
        "mean_gradients",
    )?;
    exact &= runners::compare_tensors(
        case,
        &output.updated_replicas[0],
        &expected["updated_replicas"][rank],
        &format!("updated_replicas[{rank}]"),
    )?;
    let runs = backend.take_runs();
    let on_gpu = backend.info().kind == BackendKind::Gpu;
    if runs.is_empty() {
        return Err("sgd_step_in did not run the backend's dp_sgd_step kernel".into());
    }
    if let Some(run) = runs
        .iter()
        .find(|r| r.on_device != on_gpu || r.divisor != world.world_size() as f32)
    {
        return Err(format!(
            "the step kernel ran on {} arenas with divisor {}, expected {} arenas and divisor {}",
            if run.on_device { "device" } else { "host" },
            run.divisor,
            if on_gpu { "device" } else { "host" },
            world.world_size()
        ));
    }
    backend.verified();
    Ok(exact)
}

/// One call of the data-parallel step kernel.
#[derive(Debug, Clone, Copy)]
struct StepRun {
    /// All three arenas were on a GPU device.
    on_device: bool,
    divisor: f32,
}

/// Forwards every call to `inner` and records each data-parallel step kernel it ran, with
/// where its arenas lived: the evidence that the step's arithmetic ran in the backend.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Backend>,
    runs: Mutex<Vec<StepRun>>,
    verified: Mutex<usize>,
}

impl Recording {
    fn new(inner: Arc<dyn Backend>) -> Recording {
        Recording {
            inner,
            runs: Mutex::new(Vec::new()),
            verified: Mutex::new(0),
        }
    }
    fn take_runs(&self) -> Vec<StepRun> {
        std::mem::take(&mut *self.runs.lock().unwrap())
    }
    /// Counts a case whose step was seen running in the backend's kernel.
    fn verified(&self) {
        *self.verified.lock().unwrap() += 1;
    }
    fn verified_cases(&self) -> usize {
        *self.verified.lock().unwrap()
    }
}

impl Backend for Recording {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn chunk_len(&self, rank_len: usize, ranks: usize) -> usize {
        self.inner.chunk_len(rank_len, ranks)
    }
    fn create_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> distopt::Result<Arena> {
        self.inner.create_arena(format, ranks, rank_len, chunk_len)
    }
    fn create_scratch_arena(
        &self,
        format: StorageFormat,
        ranks: usize,
        rank_len: usize,
        chunk_len: usize,
    ) -> distopt::Result<Arena> {
        self.inner
            .create_scratch_arena(format, ranks, rank_len, chunk_len)
    }
    fn copy_arena(&self, src: &Arena, dst: &mut Arena) -> distopt::Result<()> {
        self.inner.copy_arena(src, dst)
    }
    fn dp_sgd_step_with_divisor(
        &self,
        params: &mut Arena,
        grads: &Arena,
        means: &mut Arena,
        learning_rate: f32,
        divisor: f32,
    ) -> distopt::Result<()> {
        self.runs.lock().unwrap().push(StepRun {
            on_device: params.is_on_device() && grads.is_on_device() && means.is_on_device(),
            divisor,
        });
        self.inner
            .dp_sgd_step_with_divisor(params, grads, means, learning_rate, divisor)
    }
    fn sgd(&self, args: SgdArgs<'_>) -> distopt::Result<()> {
        self.inner.sgd(args)
    }
    fn adam(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> distopt::Result<()> {
        self.inner.adam(arenas, starts, scalars)
    }
    fn average(&self, args: AverageArgs<'_>) -> distopt::Result<()> {
        self.inner.average(args)
    }
    fn scaled_sum(&self, args: ScaledSumArgs<'_>) -> distopt::Result<()> {
        self.inner.scaled_sum(args)
    }
    fn lerp(&self, args: LerpArgs<'_>) -> distopt::Result<()> {
        self.inner.lerp(args)
    }
    fn convert(&self, args: ConvertArgs<'_>) -> distopt::Result<()> {
        self.inner.convert(args)
    }
    fn copy_regions(
        &self,
        src: &Arena,
        dst: &mut Arena,
        regions: &[CopyRegion],
    ) -> distopt::Result<()> {
        self.inner.copy_regions(src, dst, regions)
    }
    fn copy_between_ranks(
        &self,
        arena: &mut Arena,
        from: usize,
        to: usize,
        offset: usize,
        len: usize,
    ) -> distopt::Result<()> {
        self.inner.copy_between_ranks(arena, from, to, offset, len)
    }
    fn synchronize(&self) -> BoxFuture<'_, distopt::Result<()>> {
        self.inner.synchronize()
    }
}

/// The world size a case runs at: its `world_size`, or a `dp_sgd_step` case's replica count
/// (`None` for requests that cannot be split into one list per process).
fn case_world_size(case: &Case) -> Option<usize> {
    let input = case.input();
    if case.kind == "dp_sgd_step" {
        let params = input["parameter_replicas"].as_array()?.len();
        let grads = input["gradient_replicas"].as_array()?.len();
        return (params == grads && params > 0).then_some(params);
    }
    input["world_size"].as_u64().map(|w| w as usize)
}

/// ZeRO (Adam, bucket view) over MPI and over a simulated world of the same size in the same
/// process: every rank's parameters after each step, and the state consolidated to the last
/// rank, must be identical to the bit.
fn zero_vs_simulated(world: &Arc<MpiWorld>) -> Result<(), String> {
    use distopt::comm::SimulatedWorld;
    use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
    let s = |e: distopt::Error| e.to_string();
    let (rank, size) = (world.rank(), world.world_size());
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1));
    let shapes: [&[usize]; 5] = [&[7, 3], &[130], &[4], &[2, 2, 5], &[65]];
    let value = |seed: usize, i: usize| ((seed * 31 + i * 17) % 23) as f32 / 8.0 - 1.0;
    let params: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(j, shape)| {
            let n = shape.iter().product();
            Tensor::from_f32(shape, (0..n).map(|i| value(j, i)).collect()).unwrap()
        })
        .collect();
    let mut defaults = distopt::optim::OptionMap::new();
    defaults.insert("lr".into(), serde_json::json!(0.01));
    let options = ZeroOptions::default()
        .with_parameters_as_bucket_view(true)
        .with_overlap_with_ddp(false);
    let groups = vec![((0..shapes.len()).collect::<Vec<_>>(), Default::default())];
    let simulated: Arc<dyn Communicator> = Arc::new(SimulatedWorld::new(size).map_err(s)?);
    let mut sim_model = Replicas::replicate(backend.clone(), size, &params).map_err(s)?;
    let mut sim = ZeroRedundancyOptimizer::new(
        simulated,
        &sim_model,
        groups.clone(),
        "Adam",
        &defaults,
        options,
    )
    .map_err(s)?;
    let mut model = Replicas::replicate(backend.clone(), 1, &params).map_err(s)?;
    let mut zero =
        ZeroRedundancyOptimizer::new(world.clone(), &model, groups, "Adam", &defaults, options)
            .map_err(s)?;
    let grads = |r: usize, t: usize| -> Vec<Option<Tensor>> {
        shapes
            .iter()
            .enumerate()
            .map(|(j, shape)| {
                let n = shape.iter().product();
                // Rank 1 has no gradient for parameter 2.
                (r != 1 || j != 2).then(|| {
                    Tensor::from_f32(shape, (0..n).map(|i| value(r + 7 * t + j, i)).collect())
                        .unwrap()
                })
            })
            .collect()
    };
    for t in 0..3 {
        for r in 0..size {
            sim_model.set_grads(r, &grads(r, t)).map_err(s)?;
        }
        model.set_grads(0, &grads(rank, t)).map_err(s)?;
        sim.step(&mut sim_model).map_err(|e| e.to_string())?;
        zero.step(&mut model).map_err(|e| e.to_string())?;
        let want = sim_model.all_params().block_on().map_err(s)?;
        let got = model.all_params().block_on().map_err(s)?;
        for (j, (a, b)) in got[0].iter().zip(&want[rank]).enumerate() {
            if a.values_f64().map_err(s)? != b.values_f64().map_err(s)? {
                return Err(format!(
                    "step {t}: parameter {j} differs from the simulated world"
                ));
            }
        }
    }
    let last = size as i64 - 1;
    sim.consolidate_state_dict(&sim_model, last)
        .block_on()
        .map_err(|e| e.to_string())?;
    zero.consolidate_state_dict(&model, last)
        .block_on()
        .map_err(|e| e.to_string())?;
    if rank == size - 1 {
        let (a, b) = (
            zero.state_dict(rank).map_err(s)?,
            sim.state_dict(rank).map_err(s)?,
        );
        if a != b {
            return Err(format!("consolidated state differs:\n{a}\n{b}"));
        }
        println!(
            "rank {rank}: ZeRO over MPI equals the simulated world, consolidated state included"
        );
    } else if zero.state_dict(rank).is_ok() {
        return Err(format!(
            "rank {rank} holds a state it was not consolidated to"
        ));
    }
    Ok(())
}

/// Every rank averages twice; at the second, rank 1 fails (a panic or an error) instead of
/// joining the all-reduce that the others are already waiting in.
fn failing_worker(world: &Arc<MpiWorld>, panic: bool) -> Result<(), String> {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1));
    let value = Tensor::from_f32(&[4], vec![world.rank() as f32; 4]).map_err(|e| e.to_string())?;
    let mut replicas = Replicas::replicate(backend, 1, &[value]).map_err(|e| e.to_string())?;
    replicas
        .set_grads(0, &[Some(Tensor::from_f32(&[4], vec![0.0; 4]).unwrap())])
        .map_err(|e| e.to_string())?;
    let mut averager =
        PeriodicModelAverager::new(1, 0, world.clone()).map_err(|e| e.to_string())?;
    for step in 0..2 {
        if step == 1 && world.rank() == 1 {
            if panic {
                panic!("rank 1 hit a bug at step {step}");
            }
            return Err(format!("rank 1 failed at step {step}"));
        }
        averager
            .average_parameters(&mut replicas, None)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// A hierarchy whose group size does not divide the world: every rank must fail with the
/// same error, before any collective.
fn bad_hierarchy_worker(world: &Arc<MpiWorld>) -> Result<(), String> {
    let averager = HierarchicalModelAverager::new(&[(2, 3), (4, 4)], 0, world.clone());
    match averager {
        Ok(a) => Err(format!(
            "a hierarchy of {{2: 3, 4: 4}} was accepted: {}",
            a.step()
        )),
        Err(err) => Err(format!("{err}")),
    }
}

// ---------------------------------------------------------------------------------------------
// The launcher

fn cases_of_size(size: usize) -> Vec<Case> {
    load_cases()
        .into_iter()
        .filter(|c| KINDS.contains(&c.kind.as_str()))
        .filter(|c| case_world_size(c) == Some(size))
        .collect()
}

struct Job {
    status: Option<i32>,
    output: String,
    elapsed: Duration,
    timed_out: bool,
}

/// Runs `mpirun -np size` on this binary as `role`, killing it at `deadline`.
fn mpirun(size: usize, role: &str, backend: &str, deadline: Duration) -> Result<Job, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new("mpirun");
    command
        .args(["-np", &size.to_string(), "--oversubscribe"])
        .arg(&exe)
        .env(WORKER, role)
        .env(BACKEND, backend);
    run_job(command, deadline)
}

/// Runs `mpirun -np size distopt ARGS`.
fn mpirun_distopt(size: usize, args: &[&str], deadline: Duration) -> Result<Job, String> {
    let mut command = Command::new("mpirun");
    command
        .args(["-np", &size.to_string(), "--oversubscribe"])
        .arg(common::distopt_exe())
        .args(args);
    run_job(command, deadline)
}

/// Runs `command` (an `mpirun`) with root allowed, killing it at `deadline`.
fn run_job(mut command: Command, deadline: Duration) -> Result<Job, String> {
    let start = Instant::now();
    let mut child = command
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Ranks time-share two cores: yield instead of spinning while waiting.
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start mpirun (is OpenMPI installed?): {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut stderr = child.stderr.take().ok_or("no stderr")?;
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if start.elapsed() > deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().map_err(|e| e.to_string())?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let output = out_reader.join().unwrap_or_default() + &err_reader.join().unwrap_or_default();
    Ok(Job {
        status: status.code(),
        output,
        elapsed,
        timed_out,
    })
}

/// `distopt train` and `distopt bench comm` under mpirun.
/// `mpirun -np size distopt ARGS` must fail on every rank, each saying `error` (after its
/// `distopt rank R of SIZE: `).
fn fails_on_every_rank(size: usize, args: &[&str], error: &str, failures: &mut Vec<String>) {
    let what = format!("mpirun -np {size} distopt {}", args.join(" "));
    match mpirun_distopt(size, args, FAILURE_DEADLINE) {
        Err(e) => failures.push(e),
        Ok(job) => {
            let said = (0..size)
                .filter(|r| {
                    job.output
                        .contains(&format!("distopt rank {r} of {size}: {error}"))
                })
                .count();
            if job.status == Some(0) || job.timed_out || said != size {
                failures.push(format!(
                    "{what} must fail on every rank ({said} did): {error}\n{}",
                    job.output
                ));
            } else {
                println!("{what} failed on all {size} ranks with the same error");
            }
        }
    }
}

fn command_line(failures: &mut Vec<String>) {
    let flags = [
        "train",
        "--steps",
        "40",
        "--warmup",
        "10",
        "--period",
        "4",
        "--backend",
        "cpu",
        "--json",
    ];
    let simulated = Command::new(common::distopt_exe())
        .args(flags)
        .args(["--ranks", "4"])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
        });
    let processes = mpirun_distopt(4, &flags, GOLDEN_DEADLINE).and_then(|job| {
        if job.status != Some(0) {
            return Err(format!("exit {:?}:\n{}", job.status, job.output));
        }
        serde_json::from_str::<serde_json::Value>(job.output.trim())
            .map_err(|e| format!("{e}: {}", job.output))
    });
    match (simulated, processes) {
        (Ok(a), Ok(b)) => match same_training(&a, &b, 1e-4) {
            Ok(summary) => {
                println!("mpirun -np 4 distopt train matches the simulated run: {summary}")
            }
            Err(e) => failures.push(format!("distopt train under mpirun differs: {e}")),
        },
        (Err(e), _) | (_, Err(e)) => failures.push(format!("distopt train: {e}")),
    }
    // DiLoCo with bfloat16 pseudo-gradients: MpiWorld's rounding user op sums in bfloat16 in
    // the transport's order, the simulated world in rank order, so the curves agree within
    // bfloat16 rounding (not float32's); the bytes are the same (2 per element). A smoke test
    // of the compressed path over MPI: on this task the uncompressed curves differ from the
    // compressed ones by about 2e-4 too, so the curves alone cannot tell the wire formats
    // apart; the rounding rule itself is checked in tests/suite/diloco.rs.
    let diloco = [
        "train",
        "--algorithm",
        "diloco",
        "--compress",
        "bf16",
        "--period",
        "5",
        "--steps",
        "40",
        "--backend",
        "cpu",
        "--json",
    ];
    let simulated = Command::new(common::distopt_exe())
        .args(diloco)
        .args(["--ranks", "4"])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|o| {
            serde_json::from_slice::<serde_json::Value>(&o.stdout)
                .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&o.stderr)))
        });
    let processes = mpirun_distopt(4, &diloco, GOLDEN_DEADLINE).and_then(|job| {
        if job.status != Some(0) {
            return Err(format!("exit {:?}:\n{}", job.status, job.output));
        }
        serde_json::from_str::<serde_json::Value>(job.output.trim())
            .map_err(|e| format!("{e}: {}", job.output))
    });
    match (simulated, processes) {
        (Ok(a), Ok(b)) => match same_training(&a, &b, 5e-3) {
            Ok(summary) if a["results"][0]["settings"]["compress"] == "bf16" => println!(
                "mpirun -np 4 distopt train --algorithm diloco --compress bf16 matches the simulated run: {summary}"
            ),
            Ok(_) => failures.push(format!("diloco --compress bf16: settings {a}")),
            Err(e) => failures.push(format!("diloco --compress bf16 under mpirun differs: {e}")),
        },
        (Err(e), _) | (_, Err(e)) => failures.push(format!("distopt train --compress bf16: {e}")),
    }
    fails_on_every_rank(
        4,
        &["train", "--steps", "5", "--ranks", "8"],
        "ValueError: --ranks 8 contradicts the world of 4 processes",
        failures,
    );
    // mpirun gives stdin to rank 0 alone.
    fails_on_every_rank(
        2,
        &["train", "--algorithm", "sync", "--finish-on-stdin"],
        "ValueError: --finish-on-stdin reads each process's own standard input, which mpirun gives to rank 0 alone",
        failures,
    );
    // The README's example: values after hierarchical averaging are the group means.
    let example = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("examples/mpi_average")));
    match example {
        Some(path) if path.exists() => {
            let mut command = Command::new("mpirun");
            command.args(["-np", "4", "--oversubscribe"]).arg(&path);
            match run_job(command, FAILURE_DEADLINE) {
                Err(e) => failures.push(e),
                Ok(job) => {
                    let want = [
                        "rank 0 step 3:   5.50  (averaged over 2 ranks)",
                        "rank 3 step 3:   9.50  (averaged over 2 ranks)",
                        "rank 1 step 5:  12.50  (averaged over 4 ranks)",
                        "rank 2 step 8:  22.50",
                    ];
                    if job.status != Some(0) || want.iter().any(|w| !job.output.contains(w)) {
                        failures.push(format!(
                            "examples/mpi_average under mpirun -np 4: exit {:?}:\n{}",
                            job.status, job.output
                        ));
                    } else {
                        println!("mpirun -np 4 examples/mpi_average: the group means, as expected");
                    }
                }
            }
        }
        _ => failures.push("examples/mpi_average was not built".into()),
    }
    let bench = [
        "bench",
        "comm",
        "--elements",
        "65536",
        "--repeats",
        "3",
        "--json",
    ];
    match mpirun_distopt(2, &bench, FAILURE_DEADLINE) {
        Err(e) => failures.push(e),
        Ok(job) => {
            let report = serde_json::from_str::<serde_json::Value>(job.output.trim());
            match report {
                Ok(r)
                    if job.status == Some(0)
                        && r["world_size"] == 2
                        && r["raw_mpi_all_reduce_ms"].as_f64().is_some_and(|t| t > 0.0)
                        && r["distopt_all_reduce_mean_ms"]
                            .as_f64()
                            .is_some_and(|t| t > 0.0) =>
                {
                    println!("mpirun -np 2 distopt bench comm reports: {r}");
                }
                _ => failures.push(format!(
                    "bench comm: exit {:?}:\n{}",
                    job.status, job.output
                )),
            }
        }
    }
}

/// Compares two `distopt train --json` reports: per algorithm the loss and divergence curves
/// (within `tolerance`, relative: the transport may sum in another order) and the all-reduce
/// bytes.
fn same_training(
    a: &serde_json::Value,
    b: &serde_json::Value,
    tolerance: f64,
) -> Result<String, String> {
    let (ra, rb) = (
        a["results"].as_array().ok_or("no results")?,
        b["results"].as_array().ok_or("no results")?,
    );
    if ra.len() != rb.len() || ra.is_empty() {
        return Err(format!("{} and {} algorithms", ra.len(), rb.len()));
    }
    let mut worst = 0f64;
    for (x, y) in ra.iter().zip(rb) {
        let name = x["algorithm"].as_str().unwrap_or("?");
        for key in [
            "mean_loss_per_step",
            "divergence_per_step",
            "replica_loss_per_rank",
        ] {
            let (xs, ys) = (x[key].as_array().ok_or(key)?, y[key].as_array().ok_or(key)?);
            if xs.len() != ys.len() {
                return Err(format!(
                    "{name} {key}: {} and {} entries",
                    xs.len(),
                    ys.len()
                ));
            }
            for (i, (u, v)) in xs.iter().zip(ys).enumerate() {
                let (u, v) = (
                    u.as_f64().unwrap_or(f64::NAN),
                    v.as_f64().unwrap_or(f64::NAN),
                );
                let diff = (u - v).abs();
                worst = worst.max(diff);
                if diff.is_nan() || diff > tolerance * u.abs().max(1.0) {
                    return Err(format!("{name} {key}[{i}]: {u} simulated, {v} over MPI"));
                }
            }
        }
        if x["all_reduce_bytes_by_group_size"] != y["all_reduce_bytes_by_group_size"] {
            return Err(format!(
                "{name}: all-reduce bytes {} simulated, {} over MPI",
                x["all_reduce_bytes_by_group_size"], y["all_reduce_bytes_by_group_size"]
            ));
        }
    }
    Ok(format!(
        "{} algorithms, largest difference {worst:.1e}, same all-reduce bytes",
        ra.len()
    ))
}

/// What the ranks of one world size must report.
#[derive(Default)]
struct Expected {
    cases: usize,
    skipped_in_part: usize,
    kernel_cases: usize,
}

fn launcher() -> ExitCode {
    let mut failures = Vec::new();
    // Per world size: the cases, those with a part one rank per process cannot run (a ZeRO
    // reload into another world size), and the dp_sgd_step cases that must run the kernel.
    let mut sizes: BTreeMap<usize, Expected> = BTreeMap::new();
    for case in load_cases()
        .into_iter()
        .filter(|c| KINDS.contains(&c.kind.as_str()))
    {
        if let Some(w) = case_world_size(&case) {
            let e = sizes.entry(w).or_default();
            e.cases += 1;
            let reload = &case.input()["reload"]["world_size"];
            if case.kind == "zero_trajectory" && reload.as_u64().is_some_and(|r| r as usize != w) {
                e.skipped_in_part += 1;
            }
            if case.kind == "dp_sgd_step" && case.expected().get("error").is_none() {
                e.kernel_cases += 1;
            }
        }
    }
    for required in [2, 4, 8] {
        if !sizes.contains_key(&required) {
            failures.push(format!("no golden case at W = {required}"));
        }
    }
    let gpu_available = common::gpu_backend().is_some();
    for (&size, expected) in &sizes {
        let passed = expected.cases - expected.skipped_in_part;
        let (skipped, kernel) = (expected.skipped_in_part, expected.kernel_cases);
        for backend in ["cpu", "gpu"] {
            if backend == "gpu" && !gpu_available {
                println!("W = {size} gpu: skipped (no adapter; DISTOPT_ALLOW_NO_GPU is set)");
                continue;
            }
            match mpirun(size, "golden", backend, GOLDEN_DEADLINE) {
                Err(e) => failures.push(e),
                Ok(job) => {
                    let reports: Vec<&str> = job
                        .output
                        .lines()
                        .filter(|l| {
                            l.contains(&format!("of {size}: {passed} passed ("))
                                && l.contains(&format!(", {skipped} skipped in part ["))
                                && l.contains(&format!(
                                    "; {kernel} dp_sgd_step cases ran on the {backend} backend's kernel"
                                ))
                        })
                        .collect();
                    if job.timed_out || job.status != Some(0) || reports.len() != size {
                        failures.push(format!(
                            "golden W = {size} {backend}: exit {:?}{}, {} of {size} ranks reported {passed} passed, {skipped} skipped in part, {kernel} dp_sgd_step cases on the {backend} kernel:\n{}",
                            job.status,
                            if job.timed_out { " (timed out)" } else { "" },
                            reports.len(),
                            job.output
                        ));
                    } else {
                        println!(
                            "golden W = {size} {backend}: {passed} cases passed and {skipped} skipped in part on each of {size} ranks ({:.1} s) — {}",
                            job.elapsed.as_secs_f64(),
                            reports[0]
                        );
                    }
                }
            }
        }
    }
    for (role, needle) in [
        ("panic", "rank 1 of 4 panicked"),
        ("error", "rank 1 of 4: rank 1 failed at step 1"),
    ] {
        match mpirun(4, role, "cpu", FAILURE_DEADLINE) {
            Err(e) => failures.push(e),
            Ok(job) => {
                let message = role != "panic" || job.output.contains("rank 1 hit a bug at step 1");
                if job.timed_out
                    || job.status == Some(0)
                    || !job.output.contains(needle)
                    || !message
                {
                    failures.push(format!(
                        "a rank that fails ({role}) must end the job with its message: exit {:?}, timed out {}:\n{}",
                        job.status, job.timed_out, job.output
                    ));
                } else {
                    println!(
                        "a rank that fails ({role}) ended the job in {:.1} s with its message",
                        job.elapsed.as_secs_f64()
                    );
                }
            }
        }
    }
    command_line(&mut failures);
    match mpirun(3, "zero-vs-simulated", "cpu", FAILURE_DEADLINE) {
        Err(e) => failures.push(e),
        Ok(job) => {
            if job.status != Some(0) || !job.output.contains("rank 2: ZeRO over MPI equals") {
                failures.push(format!(
                    "ZeRO over MPI vs the simulated world: exit {:?}:\n{}",
                    job.status, job.output
                ));
            } else {
                println!(
                    "ZeRO over MPI (W = 3, Adam, bucket view) equals the simulated world bit for bit, state consolidated to rank 2 included"
                );
            }
        }
    }
    let error = "The world size (4) must be divisible by 'group_size=3'";
    match mpirun(4, "bad-hierarchy", "cpu", FAILURE_DEADLINE) {
        Err(e) => failures.push(e),
        Ok(job) => {
            let ranks = (0..4)
                .filter(|r| {
                    job.output
                        .contains(&format!("rank {r} of 4: ValueError: {error}"))
                })
                .count();
            if job.timed_out || job.status == Some(0) || ranks != 4 {
                failures.push(format!(
                    "a contradicting world size must fail on every rank: {ranks} of 4 reported it, exit {:?}:\n{}",
                    job.status, job.output
                ));
            } else {
                println!(
                    "a hierarchy the world size contradicts failed on all 4 ranks with the same error in {:.1} s",
                    job.elapsed.as_secs_f64()
                );
            }
        }
    }
    if failures.is_empty() {
        println!("mpi: all passed");
        ExitCode::SUCCESS
    } else {
        for f in &failures {
            eprintln!("FAILED: {f}");
        }
        ExitCode::FAILURE
    }
}
