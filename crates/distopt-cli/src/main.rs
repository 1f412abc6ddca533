//! `distopt`: the command-line face of the library.
//!
//! ```text
//! distopt step [FILE|-] [--backend auto|gpu|cpu]   one data-parallel SGD step from JSON
//! distopt info                                     the adapter and backend chosen, and why
//! distopt bench step [--ranks R] [--elements N] [--dtype D] [--backend B] [--repeats K] [--json]
//! distopt bench average|optim|zero [--ranks R] [--elements N] [--params P,…] [--json]
//! distopt bench all [--backend B] [--torch PYTHON] [--repeats K] [--json]  the whole report
//! distopt train [--ranks R] [--steps S] [--algorithm A] [--backend B] [--json]  local SGD demo
//! ```

use std::io::Read;
use std::process::ExitCode;

use distopt::Error;
use distopt::backend::{BackendChoice, select_backend_blocking};

mod bench;
mod bench_algorithms;
mod bench_all;
#[cfg(feature = "mpi")]
mod bench_comm;
mod train;

const USAGE: &str = "usage:
  distopt step [FILE|-] [--backend auto|gpu|cpu]
      Reads {\"parameter_replicas\", \"gradient_replicas\", \"learning_rate\"} (stdin when FILE
      is - or absent) and prints {\"mean_gradients\", \"updated_replicas\"}.
  distopt info
      Prints the GPU adapter found (name, API, device type, limits) and which backend
      --backend auto picks, with the reason.
  distopt bench step [--ranks R] [--elements N] [--dtype float32|float16|bfloat16]
                     [--backend auto|gpu|cpu] [--repeats K] [--json]
      Times the step resident on the GPU, one-shot from host tensors, on the CPU backend,
      against the adapter's buffer copy and a host memcpy of the same bytes (median ms and
      GB/s of (2R+2)*N*element bytes). Defaults: R 4, N 2^22 (an integer or 2^k), float32,
      K 10. --backend auto and gpu use any adapter wgpu finds (software ones included);
      cpu skips the GPU rows. --json prints one JSON object.
  distopt bench all [--backend B] [--torch PYTHON] [--repeats K] [--json]
      Every benchmark of docs/performance.md as one report: the step (R 4 and 8, N 2^20 and
      2^22, float32 and float16), optim and average, each with its same-traffic roofline;
      with --torch, PyTorch doing the same work in the same run (bench/peers/*.py) and the
      ratios. Default backend cpu.
  distopt bench average|optim [--ranks R] [--elements N] [--params P1,P2] [--backend B]
                             [--repeats K] [--json]
      One all-reduce-mean over the world (average), one SGD-momentum and one Adam step
      (optim), resident, over R ranks x N float32 elements split into P parameters (default
      1 and 1000), against the backend's copy of the same bytes. Defaults: R 8, N 2^22.
  distopt bench zero [--worlds 1,2,4,8] [--elements N] [--params P] [--backend B] [--json]
      A ZeroRedundancyOptimizer Adam step and the optimizer state per rank for each world
      size, over the same model (default 100 parameters, 2^24 elements).
  distopt train [--ranks R] [--steps S] [--lr X] [--momentum M] [--batch B] [--period P]
                [--warmup K] [--algorithm sync|periodic|hierarchical|zero|diloco|all]
                [--fragments F] [--compress bf16|f16] [--samples N]
                [--heterogeneity H] [--backend auto|gpu|cpu] [--seed SEED] [--json]
      R simulated ranks train a small MLP on a synthetic data set split across them (each
      shard skewed towards one class) with synchronous SGD, post-local SGD averaging the
      parameters every P steps, and hierarchical averaging (every P/2^k steps over R/2^k
      ranks), the last two after K warm-up steps of synchronous SGD, ZeRO (synchronous SGD
      with the optimizer state sharded over the ranks), and DiLoCo (local steps, every P
      steps the outer SGD (lr 0.7, Nesterov 0.9) on the mean pseudo-gradient; with
      --fragments F > 1 Streaming DiLoCo, F fragments syncing staggered; with --compress
      bf16|f16 (diloco only) the pseudo-gradients all-reduced in that format); prints final loss,
      divergence between replicas, bytes communicated per rank and time per step (a
      progress bar on stderr when it is a terminal). Defaults: R 8, S 200, X 0.05, M 0.9,
      B 32, P 8, K 20, all, N 4096, H 0.8, SEED 0, backend auto. --json prints one JSON
      object. Under `mpirun -np W` (a build with the `mpi` feature) each process is one rank:
      the same flags, R defaults to W, and the first rank prints the report.
  mpirun -np W distopt bench comm [--elements N] [--repeats K] [--backend B] [--json]
      (feature `mpi`) All-reduce-mean of N float32 elements per rank through distopt's MPI
      world against a raw MPI_Allreduce of the same bytes, in the same run. Defaults: N 2^22,
      K 30, backend cpu.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    #[cfg(feature = "mpi")]
    if distopt::comm::MpiWorld::launched() {
        return mpi_main(&args);
    }
    let result = match args.first().map(String::as_str) {
        Some("step") => step(&args[1..]),
        Some("info") => info(),
        Some("bench") => bench::run(&args[1..]),
        Some("train") => train::run(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(Error::value(format!("expected a command\n{USAGE}"))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("distopt: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Removes `--name VALUE` from `args`, returning VALUE.
/// One rank of an MPI job: `train` and `bench comm` run on every process; an error on any
/// rank ends the whole job with its message.
#[cfg(feature = "mpi")]
fn mpi_main(args: &[String]) -> ExitCode {
    use distopt::comm::mpi::{MpiWorld, install_panic_hook};
    let world = match MpiWorld::initialize() {
        Ok(world) => world,
        Err(err) => {
            eprintln!("distopt: {err}");
            return ExitCode::FAILURE;
        }
    };
    install_panic_hook(&world);
    let result = match (
        args.first().map(String::as_str),
        args.get(1).map(String::as_str),
    ) {
        (Some("train"), _) => train::run_in(&args[1..], Some(world.clone())),
        (Some("bench"), Some("comm")) => bench_comm::run(&args[2..], &world),
        _ => Err(Error::value(format!(
            "under mpirun, distopt runs `train` and `bench comm`\n{USAGE}"
        ))),
    };
    match result {
        Ok(()) => {
            // The last reference: MPI_Finalize.
            drop(world);
            ExitCode::SUCCESS
        }
        Err(err) => world.abort_with(&err.to_string(), 1),
    }
}

pub(crate) fn take_option(args: &mut Vec<String>, name: &str) -> Result<Option<String>, Error> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) if i + 1 < args.len() => {
            let value = args.remove(i + 1);
            args.remove(i);
            Ok(Some(value))
        }
        Some(_) => Err(Error::value(format!("{name} needs a value"))),
    }
}

/// Removes the flag `name` from `args`, returning whether it was there.
#[allow(dead_code)] // used by `bench`
pub(crate) fn take_flag(args: &mut Vec<String>, name: &str) -> bool {
    let before = args.len();
    args.retain(|a| a != name);
    args.len() != before
}

fn step(args: &[String]) -> Result<(), Error> {
    let mut args = args.to_vec();
    let choice = BackendChoice::parse(
        &take_option(&mut args, "--backend")?.unwrap_or_else(|| "auto".into()),
    )?;
    if let Some(unknown) = args.iter().find(|a| a.starts_with("--")) {
        return Err(Error::value(format!("unknown option {unknown}\n{USAGE}")));
    }
    let text = match args.first().map(String::as_str) {
        None | Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::value(format!("cannot read stdin: {e}")))?;
            text
        }
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Error::value(format!("cannot read {path}: {e}")))?,
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::value(format!("invalid JSON: {e}")))?;
    let request = distopt::step::step_request_from_json(&value)?;
    let selection = select_backend_blocking(choice)?;
    let output = distopt::sgd_step_blocking(
        selection.backend.as_ref(),
        &request.parameter_replicas,
        &request.gradient_replicas,
        request.learning_rate,
    )?;
    let json = pollster::block_on(distopt::step::step_output_to_json(&output))?;
    println!("{json}");
    Ok(())
}

fn info() -> Result<(), Error> {
    match distopt::GpuBackend::new_blocking() {
        Ok(gpu) => {
            let i = distopt::Backend::info(&gpu);
            println!("GPU adapter: {}", i.name);
            println!(
                "  api: {}, device type: {}, driver: {}",
                i.api, i.device_type, i.driver
            );
            println!(
                "  storage binding used: {} MiB (arenas above are chunked), max buffer: {} MiB",
                i.max_binding_bytes >> 20,
                i.max_buffer_bytes >> 20
            );
            println!(
                "  workgroups per dimension: {}",
                i.max_workgroups_per_dimension
            );
            println!("  mappable primary buffers: {}", i.mappable_primary_buffers);
        }
        Err(err) => println!("GPU adapter: none ({})", err.message()),
    }
    let auto = select_backend_blocking(BackendChoice::Auto)?;
    let i = auto.backend.info();
    println!(
        "--backend auto picks: {:?} ({}), because {}",
        i.kind, i.name, auto.reason
    );
    if i.kind == distopt::BackendKind::Cpu {
        println!("  CPU threads: {}", i.threads);
    }
    Ok(())
}
