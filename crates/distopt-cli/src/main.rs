//! `distopt`: the command-line face of the library. Run `distopt --help` (and `distopt
//! <COMMAND> --help`) for the grammar, which lives in `args.rs`.

use crate::output::outln;
use std::io::Read;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use distopt::BlockOn;
use distopt::Error;
use distopt::backend::{BackendChoice, select_backend};
use serde_json::json;

mod args;
mod bench;
mod bench_algorithms;
mod bench_all;
#[cfg(any(feature = "mpi", feature = "nats"))]
mod bench_comm;
#[cfg(feature = "nats")]
mod bench_overlap;
mod bench_recovery;
mod finish;
mod output;
mod progress;
mod train;
mod world;

#[cfg(feature = "mpi")]
use args::Bench;
use args::{Cli, Command};

/// The exit status of a usage error (an unknown flag, a missing value, an extra argument), as
/// clap and most Unix tools use it; errors of the request itself exit 1.
const USAGE_ERROR: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    #[cfg(feature = "mpi")]
    if distopt::comm::MpiWorld::launched() {
        return mpi_main(cli);
    }
    if let Err(err) = check_budget_variable() {
        eprintln!("distopt: {err}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Step(args) => step(args),
        Command::Info(args) => info(args.json),
        Command::Bench(args) => bench::run(args.which),
        Command::Train(args) => train::run(*args),
        Command::NatsConfig(args) => world::nats_config(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("distopt: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Prints a usage error as one line and a hint (help and version go to stdout, exit 0).
fn usage_error(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    // The (sub)command the mistake was made in: the words of the command line that name
    // subcommands, from the top.
    let mut command = Cli::command();
    let mut path = vec![command.get_name().to_string()];
    for word in std::env::args().skip(1) {
        match command.find_subcommand(&word) {
            Some(sub) => {
                path.push(word.clone());
                command = sub.clone();
            }
            None if word.starts_with('-') => continue,
            None => break,
        }
    }
    let path = path.join(" ");
    let text = err.render().to_string();
    let message = match err.kind() {
        ErrorKind::MissingSubcommand | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let names: Vec<&str> = command
                .get_subcommands()
                .map(|c| c.get_name())
                .filter(|&n| n != "help")
                .collect();
            format!("'{path}' needs a command: {}", names.join(", "))
        }
        _ => text
            .lines()
            .next()
            .unwrap_or("invalid arguments")
            .trim_start_matches("error: ")
            .to_string(),
    };
    let tip = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("tip:"))
        .map(|tip| format!("{tip}; "))
        .unwrap_or_default();
    eprintln!("distopt: usage error: {message}\n  {tip}see '{path} --help'");
    ExitCode::from(USAGE_ERROR)
}

/// An invalid `DISTOPT_MEMORY_BUDGET` is an error of the command line, not silently ignored.
fn check_budget_variable() -> Result<(), Error> {
    match std::env::var(distopt::budget::ENV_VAR) {
        Ok(text) => distopt::budget::parse_bytes(&text)
            .map(|_| ())
            .map_err(|e| Error::value(format!("{}: {}", distopt::budget::ENV_VAR, e.message()))),
        Err(_) => Ok(()),
    }
}

/// One rank of an MPI job: `train` and `bench comm` run on every process; an error on any
/// rank ends the whole job with its message.
#[cfg(feature = "mpi")]
fn mpi_main(cli: Cli) -> ExitCode {
    use distopt::comm::mpi::{MpiWorld, install_panic_hook};
    let world = match MpiWorld::initialize() {
        Ok(world) => world,
        Err(err) => {
            eprintln!("distopt: {err}");
            return ExitCode::FAILURE;
        }
    };
    install_panic_hook(&world);
    let result = check_budget_variable().and_then(|()| match cli.command {
        // mpirun gives its standard input to rank 0 alone: the others would read its end at
        // once, stop, and leave rank 0 waiting in a collective for good.
        Command::Train(args) if args.finish_on_stdin => Err(Error::value(
            "--finish-on-stdin reads each process's own standard input, which mpirun gives to rank 0 alone: end a run under mpirun with --steps",
        )),
        Command::Train(args) => train::run_in(*args, Some(world.clone())),
        Command::Bench(args) => match args.which {
            Bench::Comm(args) => {
                bench_comm::run(args, world.clone(), &bench_comm::Mpi(world.clone()))
            }
            _ => Err(Error::value(
                "under mpirun, distopt runs `train` and `bench comm`",
            )),
        },
        _ => Err(Error::value(
            "under mpirun, distopt runs `train` and `bench comm`",
        )),
    });
    match result {
        Ok(()) => {
            // The last reference: MPI_Finalize.
            drop(world);
            ExitCode::SUCCESS
        }
        Err(err) => world.abort_with(&err.to_string(), 1),
    }
}

fn step(args: args::StepArgs) -> Result<(), Error> {
    let text = match args.file.as_deref() {
        Some(path) if path != std::path::Path::new("-") => std::fs::read_to_string(path)
            .map_err(|e| Error::value(format!("cannot read {}: {e}", path.display())))?,
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Error::value(format!("cannot read stdin: {e}")))?;
            text
        }
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::value(format!("invalid JSON: {e}")))?;
    let request = distopt::step::step_request_from_json(&value)?;
    let selection = select_backend(args.backend).block_on()?;
    let output = distopt::sgd_step(
        selection.backend.as_ref(),
        &request.parameter_replicas,
        &request.gradient_replicas,
        request.learning_rate,
    )
    .block_on()?;
    let json = pollster::block_on(distopt::step::step_output_to_json(&output))?;
    outln!("{json}");
    Ok(())
}

/// `distopt info [--json]`: the adapter wgpu finds, the backend `auto` picks and why, and the
/// memory budget.
fn info(as_json: bool) -> Result<(), Error> {
    let gpu = distopt::GpuBackend::new().block_on();
    let auto = select_backend(BackendChoice::Auto).block_on()?;
    let picked = auto.backend.info();
    let budget = distopt::budget::limit();
    let budget_source = if std::env::var_os(distopt::budget::ENV_VAR).is_some() {
        distopt::budget::ENV_VAR
    } else {
        "default"
    };
    if as_json {
        let adapter = match &gpu {
            Ok(gpu) => {
                let i = distopt::Backend::info(gpu);
                json!({
                    "name": i.name,
                    "api": i.api,
                    "device_type": i.device_type,
                    "driver": i.driver,
                    "max_binding_bytes": i.max_binding_bytes,
                    "max_buffer_bytes": i.max_buffer_bytes,
                    "max_workgroups_per_dimension": i.max_workgroups_per_dimension,
                    "mappable_primary_buffers": i.mappable_primary_buffers,
                })
            }
            Err(_) => serde_json::Value::Null,
        };
        let report = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "gpu_adapter": adapter,
            "gpu_error": gpu.as_ref().err().map(|e| e.message().to_string()),
            "auto": {
                "kind": format!("{:?}", picked.kind).to_lowercase(),
                "name": picked.name,
                "reason": auto.reason,
                "threads": picked.threads,
            },
            "memory_budget": {"bytes": budget, "source": budget_source},
        });
        outln!("{report}");
        return Ok(());
    }
    match &gpu {
        Ok(gpu) => {
            let i = distopt::Backend::info(gpu);
            outln!("GPU adapter: {}", i.name);
            outln!(
                "  api: {}, device type: {}, driver: {}",
                i.api,
                i.device_type,
                i.driver
            );
            outln!(
                "  storage binding used: {} MiB (arenas above are chunked), max buffer: {} MiB",
                i.max_binding_bytes >> 20,
                i.max_buffer_bytes >> 20
            );
            outln!(
                "  workgroups per dimension: {}",
                i.max_workgroups_per_dimension
            );
            outln!("  mappable primary buffers: {}", i.mappable_primary_buffers);
        }
        Err(err) => outln!("GPU adapter: none ({})", err.message()),
    }
    outln!(
        "--backend auto picks: {:?} ({}), because {}",
        picked.kind,
        picked.name,
        auto.reason
    );
    if picked.kind == distopt::BackendKind::Cpu {
        outln!("  CPU threads: {}", picked.threads);
    }
    outln!(
        "memory budget: {} ({budget_source}; set {} to change it)",
        distopt::budget::human(budget),
        distopt::budget::ENV_VAR
    );
    Ok(())
}
