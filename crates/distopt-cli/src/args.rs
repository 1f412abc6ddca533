//! The command line's grammar (clap, derive): every subcommand, flag and default, and the help
//! texts. The subcommands' own files turn these into their configurations and check what
//! depends on more than one flag (those mistakes are `ValueError`s, exit 1); a mistake of the
//! grammar itself (an unknown flag, a missing or malformed value, a flag given twice, an extra
//! argument) is a usage error: one line and a hint on stderr, exit 2.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use distopt::DType;
use distopt::backend::BackendChoice;

/// The most timed repetitions a benchmark takes (each keeps one sample in memory).
pub const MAX_REPEATS: usize = 1_000_000;

const OVERVIEW: &str = "\
Commands at a glance:
  distopt step [FILE|-] [--backend auto|gpu|cpu]   one data-parallel SGD step from JSON
  distopt info [--json]                            the adapter and backend chosen, and why
  distopt bench step|average|optim|zero|all …      the benchmarks of docs/performance.md
  distopt bench recovery --world nats://HOST:PORT  an elastic run's recovery over NATS
  distopt train [--algorithm …] [--json] …         local SGD, ZeRO and DiLoCo compared
  mpirun -np W distopt train|bench comm …          (feature mpi) one rank per process

Run 'distopt <COMMAND> --help' for a command's flags. Errors name Python's exception
classes (distopt: ValueError: …) and exit 1; usage errors exit 2.";

/// `distopt`: PyTorch's data-parallel optimizer family on any GPU (wgpu) or the host's cores.
#[derive(Debug, Parser)]
#[command(
    name = "distopt",
    version,
    about = "PyTorch's data-parallel optimizers (SGD, Adam, post-local SGD, ZeRO, DiLoCo) on any GPU or the CPU",
    after_help = OVERVIEW,
    propagate_version = true,
    subcommand_required = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// One data-parallel SGD step from JSON.
    ///
    /// Reads {"parameter_replicas", "gradient_replicas", "learning_rate"} (stdin when FILE is
    /// - or absent) and prints {"mean_gradients", "updated_replicas"}.
    Step(StepArgs),
    /// The GPU adapter found and which backend --backend auto picks, with the reason.
    ///
    /// Prints the adapter's name, API, device type and limits, the backend `auto` picks and
    /// why, and the memory budget; --json prints the same as one JSON object.
    Info(InfoArgs),
    /// The benchmarks: the step, averaging, optimizers and ZeRO against the copies of the
    /// same bytes.
    Bench(BenchArgs),
    /// R simulated ranks train a small model with every algorithm, compared.
    ///
    /// R ranks train a small MLP on a data set split across them (each shard skewed towards
    /// one class) with synchronous SGD, post-local SGD averaging every P steps, hierarchical
    /// averaging (every P/2^k steps over R/2^k ranks), the last two after K warm-up steps of
    /// synchronous SGD, ZeRO, and DiLoCo (local steps; every P steps the outer Nesterov SGD on
    /// the mean pseudo-gradient; --fragments F > 1: Streaming DiLoCo, with torchft's
    /// --fragment-sync-delay and --fragment-update-alpha; --compress: the
    /// pseudo-gradients all-reduced in bf16/f16). Prints final loss, divergence between
    /// replicas, bytes communicated per rank and time per step, with a progress bar on stderr
    /// when it is a terminal. Under `mpirun -np W` (a build with the `mpi` feature) each
    /// process is one rank: the same flags, --ranks defaults to W, the first rank prints. With
    /// --world nats://HOST:PORT --run NAME --ranks R (the `nats` feature), R processes started
    /// on their own, on any machines reaching the server, train as one run; under DiLoCo and
    /// the averagers the survivors of a killed process finish it, and the lowest live rank
    /// prints.
    Train(Box<TrainArgs>),
    /// A nats-server configuration isolating runs: one user per run.
    ///
    /// Prints a configuration file for `nats-server -c FILE`: JetStream on, and for each
    /// --run NAME:SECRET a user NAME with password SECRET whose permissions reach only that
    /// run's subjects and key-value bucket, so a process holding one run's secret can neither
    /// read nor write another run. Processes join with --run NAME --run-secret SECRET.
    NatsConfig(NatsConfigArgs),
}

/// `distopt step`.
#[derive(Debug, Args)]
pub struct StepArgs {
    /// The request's JSON file; - or absent: stdin.
    #[arg(value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The backend: auto (a real GPU when there is one, else the CPU), gpu or cpu.
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = backend)]
    pub backend: BackendChoice,
}

/// `distopt info`.
#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub which: Bench,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
#[command(subcommand_required = true)]
pub enum Bench {
    /// The step resident on the GPU, one-shot from host tensors and on the CPU backend.
    ///
    /// Times the step against the adapter's buffer copy and a host memcpy of the same bytes
    /// (median ms and GB/s of (2R+2)·N·element bytes). --backend auto and gpu use any adapter
    /// wgpu finds (software ones included); cpu skips the GPU rows.
    Step(BenchStepArgs),
    /// One all-reduce-mean over the world, resident, against the backend's copy.
    Average(AlgorithmBenchArgs),
    /// One SGD-momentum and one Adam step, resident, against the backend's copy.
    Optim(AlgorithmBenchArgs),
    /// A ZeroRedundancyOptimizer Adam step and the optimizer state per rank for each world
    /// size, over the same model.
    Zero(ZeroBenchArgs),
    /// Every benchmark of docs/performance.md as one report.
    ///
    /// The step (R 4 and 8, N 2^20 and 2^22, float32 and float16), optim and average, each
    /// with its same-traffic roofline; with --torch, PyTorch doing the same work in the same
    /// run (bench/peers/*.py) and the ratios.
    All(BenchAllArgs),
    /// (feature mpi, under mpirun) all-reduce-mean through distopt's MPI world against a raw
    /// MPI_Allreduce of the same bytes.
    Comm(BenchCommArgs),
    /// (feature nats) An elastic run's recovery: the time from a rank's death to the
    /// survivors' next sync, and from a joining process's start to its heal, against the
    /// failure-detection bound.
    ///
    /// Starts W `distopt train --world` processes of this executable on the server, SIGKILLs
    /// the last rank after --kill-after, starts a `--join` process in its place, and reads the
    /// times the survivors agreed on each new membership from rank 0's report.
    Recovery(BenchRecoveryArgs),
    /// (feature nats, once per process with --world) Streaming DiLoCo's fragment all-reduce in
    /// flight during its delay, against the same processes with no communication and with
    /// blocking syncs: wall-clock per inner step of the demo's task.
    Overlap(BenchOverlapArgs),
}

/// `distopt bench overlap`.
#[derive(Debug, Args)]
pub struct BenchOverlapArgs {
    /// The run: --world nats://HOST:PORT --run NAME (and --ranks W), once per process.
    #[command(flatten)]
    pub world: WorldArgs,
    /// Processes W of the run.
    #[arg(long, value_name = "W", default_value = "4", value_parser = count)]
    pub ranks: usize,
    /// Timed inner steps per row and round.
    #[arg(long, value_name = "N", default_value = "1024", value_parser = count)]
    pub steps: usize,
    /// DiLoCo's sync_every H.
    #[arg(long, value_name = "H", default_value = "64", value_parser = count)]
    pub sync_every: usize,
    /// Fragments F.
    #[arg(long, value_name = "F", default_value = "2", value_parser = count)]
    pub fragments: usize,
    /// Inner steps a fragment's all-reduce is in flight (below H / F).
    #[arg(long, value_name = "D", default_value = "16", value_parser = count)]
    pub fragment_sync_delay: usize,
    /// Rounds (the median is reported).
    #[arg(long, value_name = "K", default_value = "5", value_parser = repeats)]
    pub repeats: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench recovery`.
#[derive(Debug, Args)]
pub struct BenchRecoveryArgs {
    /// The NATS server the processes meet on (its token: $DISTOPT_NATS_TOKEN).
    #[arg(long, value_name = "nats://HOST:PORT")]
    pub world: String,
    /// Processes W.
    #[arg(long, value_name = "W", default_value = "3", value_parser = count)]
    pub ranks: usize,
    /// The elastic algorithm: diloco, periodic or hierarchical.
    #[arg(long, value_name = "NAME", default_value = "diloco")]
    pub algorithm: String,
    /// Steps of each run: long enough to outlast the kill, the failure bound and the join.
    #[arg(long, value_name = "N", default_value = "8000", value_parser = count)]
    pub steps: usize,
    /// Seconds of training before the kill.
    #[arg(long, value_name = "S", default_value = "3")]
    pub kill_after: f64,
    /// Runs measured (the median is reported).
    #[arg(long, value_name = "K", default_value = "3", value_parser = repeats)]
    pub repeats: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench step`.
#[derive(Debug, Args)]
pub struct BenchStepArgs {
    /// Ranks R.
    #[arg(long, value_name = "R", default_value = "4", value_parser = count)]
    pub ranks: usize,
    /// Elements N per rank: an integer, 2^k or 1<<k.
    #[arg(long, value_name = "N", default_value = "2^22", value_parser = count)]
    pub elements: usize,
    /// Element type: float32, float16 or bfloat16.
    #[arg(long, value_name = "DTYPE", default_value = "float32", value_parser = dtype)]
    pub dtype: DType,
    /// The backend: auto, gpu or cpu (cpu skips the GPU rows).
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = backend)]
    pub backend: BackendChoice,
    /// Timed repetitions per row (the median is reported).
    #[arg(long, value_name = "K", default_value = "10", value_parser = repeats)]
    pub repeats: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench average|optim`, and the shared part of `bench zero`.
#[derive(Debug, Args)]
pub struct AlgorithmBenchArgs {
    /// Ranks R (default 8; bench zero: 1).
    #[arg(long, value_name = "R", value_parser = count)]
    pub ranks: Option<usize>,
    /// float32 elements N per rank (default 2^22; bench zero: 2^24).
    #[arg(long, value_name = "N", value_parser = count)]
    pub elements: Option<usize>,
    /// Parameter counts to split N into, comma-separated (default 1,1000; bench zero: 100).
    #[arg(long, value_name = "P1,P2,…", value_delimiter = ',', value_parser = count)]
    pub params: Option<Vec<usize>>,
    /// Timed repetitions per row (the median is reported).
    #[arg(long, value_name = "K", default_value = "7", value_parser = repeats)]
    pub repeats: usize,
    /// The backend: auto, gpu or cpu.
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = backend)]
    pub backend: BackendChoice,
    /// The parameters' element type (bench optim): float32, bfloat16 or float16.
    #[arg(long, value_name = "DTYPE", value_parser = dtype)]
    pub dtype: Option<DType>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench zero`.
#[derive(Debug, Args)]
pub struct ZeroBenchArgs {
    /// World sizes, comma-separated.
    #[arg(long, value_name = "W1,W2,…", value_delimiter = ',', default_value = "1,2,4,8", value_parser = count)]
    pub worlds: Vec<usize>,
    /// The model and timing flags.
    #[command(flatten)]
    pub common: AlgorithmBenchArgs,
}

/// `distopt bench all`.
#[derive(Debug, Args)]
pub struct BenchAllArgs {
    /// The backend: auto, gpu or cpu.
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "cpu", value_parser = backend_name)]
    pub backend: String,
    /// A Python with PyTorch: runs the peers (bench/peers/*.py) in the same run.
    #[arg(long, value_name = "PYTHON")]
    pub torch: Option<PathBuf>,
    /// Timed repetitions per row.
    #[arg(long, value_name = "K", default_value = "7", value_parser = repeats)]
    pub repeats: usize,
    /// Print one JSON report instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `distopt bench comm`.
#[derive(Debug, Args)]
pub struct BenchCommArgs {
    /// Over NATS: --world nats://HOST:PORT --run NAME (and --ranks W), once per process.
    #[command(flatten)]
    pub world: WorldArgs,
    /// Processes W of a NATS run (with --world).
    #[arg(long, value_name = "W", requires = "world")]
    pub ranks: Option<usize>,
    /// float32 elements N per rank.
    #[arg(long, value_name = "N", default_value = "2^22", value_parser = count)]
    pub elements: usize,
    /// Timed repetitions.
    #[arg(long, value_name = "K", default_value = "30", value_parser = repeats)]
    pub repeats: usize,
    /// The backend: auto, gpu or cpu.
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "cpu", value_parser = backend)]
    pub backend: BackendChoice,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The data a `train` run learns. Adding a task is one variant here and one arm where the
/// task is built (`train.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TrainTask {
    /// Gaussian clusters, each rank's shard skewed towards one class (--samples,
    /// --heterogeneity).
    Synthetic,
    /// The UCI hand-written digits (1,797 8×8 images, 10 classes; CC BY 4.0): a held-out
    /// fifth, the rest split across the ranks non-IID (--heterogeneity: the share sorted by
    /// label).
    Digits,
}

/// One rank per process over a NATS server (`train`, `bench comm`).
#[derive(Debug, Clone, Args)]
pub struct WorldArgs {
    /// One rank per process over a NATS server (a build with the `nats` feature): start this
    /// command once per rank, each with the same --world, --run and --ranks; the first rank
    /// prints the same report as the simulated run of the same flags.
    #[arg(long, value_name = "nats://HOST:PORT")]
    pub world: Option<String>,
    /// The run's name (with --world): processes with the same name train together.
    #[arg(long, value_name = "NAME", requires = "world")]
    pub run: Option<String>,
    /// The rank to take (with --world; default: the lowest free one).
    #[arg(long, value_name = "K", requires = "world")]
    pub rank: Option<usize>,
    /// The server's authentication token (with --world; default: $DISTOPT_NATS_TOKEN).
    #[arg(long, value_name = "SECRET", requires = "world")]
    pub token: Option<String>,
    /// The run's secret, on a server with a user per run (`distopt nats-config`; with --world;
    /// default: $DISTOPT_RUN_SECRET).
    #[arg(long, value_name = "SECRET", requires = "world")]
    pub run_secret: Option<String>,
    /// A PEM file of the certificate authorities that signed the server's TLS certificate
    /// (with --world; a `tls://` URL without it trusts the system's): TLS is then required.
    #[arg(long, value_name = "FILE", requires = "world")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Join the running run (with --world; --algorithm diloco, periodic or hierarchical) as a rank
    /// that left it (--rank, or the lowest such): taken in at its next sync point, healed there
    /// from a live rank (parameters, optimizer states, counters), then training with the others.
    #[arg(long, requires = "world")]
    pub join: bool,
}

/// `distopt nats-config`.
#[derive(Debug, Args)]
pub struct NatsConfigArgs {
    /// A run the server admits, as a user of its own that reaches only that run's subjects and
    /// bucket (repeat for more runs); the secret is 8 to 128 characters of A-Z a-z 0-9 - . _ ~.
    #[arg(long = "run", value_name = "NAME:SECRET", required = true)]
    pub runs: Vec<String>,
    /// The client port.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:4222")]
    pub listen: String,
    /// A WebSocket port for browser ranks (no TLS: put TLS in front of it on the internet).
    #[arg(long, value_name = "HOST:PORT")]
    pub websocket: Option<String>,
    /// JetStream's store folder.
    #[arg(long, value_name = "DIR")]
    pub store_dir: Option<String>,
}

/// `distopt train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The data set.
    #[arg(long, value_enum, default_value_t = TrainTask::Synthetic)]
    pub task: TrainTask,
    /// Ranks R (default 8; under mpirun: the number of processes; with --world: the processes
    /// the run waits for).
    #[arg(long, value_name = "R")]
    pub ranks: Option<usize>,
    /// One rank per process over a NATS server: --world, --run, --rank, --token.
    #[command(flatten)]
    pub world: WorldArgs,
    /// Training steps S.
    #[arg(long, value_name = "S", default_value_t = 200)]
    pub steps: u64,
    /// Train until a line `finish N` arrives on standard input, then stop after step N (at
    /// most S): how the processes of a run end together at a step chosen while it runs (tell
    /// each the same N). Every 50 steps the process writes `progress STEP` to stderr; standard
    /// input closing without a `finish` line ends the training at the step reached.
    #[arg(long)]
    pub finish_on_stdin: bool,
    /// Learning rate (default 0.05).
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// SGD momentum (default 0.9).
    #[arg(long, value_name = "M", allow_negative_numbers = true)]
    pub momentum: Option<f64>,
    /// Batch size per rank (default 32).
    #[arg(long, value_name = "B")]
    pub batch: Option<usize>,
    /// Averaging period P (post-local SGD), DiLoCo's sync interval.
    #[arg(long, value_name = "P", default_value_t = 8)]
    pub period: u64,
    /// Warm-up steps K of synchronous SGD before post-local SGD starts.
    #[arg(long, value_name = "K", default_value_t = distopt::train::DEFAULT_WARMUP)]
    pub warmup: u64,
    /// sync, periodic, hierarchical, zero, diloco or all.
    #[arg(long, value_name = "ALGORITHM", default_value = "all")]
    pub algorithm: String,
    /// DiLoCo's fragments F (F > 1: Streaming DiLoCo).
    #[arg(long, value_name = "F", default_value_t = 1)]
    pub fragments: usize,
    /// DiLoCo's pseudo-gradients on the wire: bf16, f16 or none (--algorithm diloco only).
    #[arg(long, value_name = "bf16|f16")]
    pub compress: Option<String>,
    /// DiLoCo's fragment_sync_delay D (torchft's): a fragment's all-reduce starts D inner
    /// steps before its outer step; D < P / F (--algorithm diloco only).
    #[arg(long, value_name = "D")]
    pub fragment_sync_delay: Option<u64>,
    /// DiLoCo's fragment_update_alpha A in [0, 1] (torchft's): after an outer step the
    /// fragment's parameters become lerp(global, local, A), as torchft mixes them, at 0 too
    /// (default: no mix) (--algorithm diloco only).
    #[arg(long, value_name = "A")]
    pub fragment_update_alpha: Option<f64>,
    /// Replay ranks leaving and joining in the simulated world: the live ranks of each sync
    /// point of the elastic algorithms (periodic, hierarchical, diloco), `;` between sync
    /// points, `,` between ranks, for example `0,1,2,3;0,1,3;0,1,2,3` (the last list stays).
    #[arg(long, value_name = "SCHEDULE", conflicts_with = "world")]
    pub membership: Option<String>,
    /// Samples of the synthetic task (default 4096).
    #[arg(long, value_name = "N")]
    pub samples: Option<usize>,
    /// How skewed each rank's shard is, in [0, 1] (default 0.8).
    #[arg(long, value_name = "H", allow_negative_numbers = true)]
    pub heterogeneity: Option<f64>,
    /// The backend: auto, gpu or cpu.
    #[arg(long, value_name = "auto|gpu|cpu", default_value = "auto", value_parser = backend)]
    pub backend: BackendChoice,
    /// The seed of the data and the model.
    #[arg(long, value_name = "SEED", default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `--backend`: the library's parser and its message.
fn backend(text: &str) -> Result<BackendChoice, String> {
    BackendChoice::parse(text).map_err(|e| e.message().to_string())
}

/// `--backend` passed on as text (bench all runs itself), checked here.
fn backend_name(text: &str) -> Result<String, String> {
    backend(text).map(|_| text.to_string())
}

/// `--dtype`.
fn dtype(text: &str) -> Result<DType, String> {
    DType::parse(text).map_err(|e| e.message().to_string())
}

/// A positive count: `4194304`, `2^22` or `1<<22` (`_` separators allowed).
pub fn count(text: &str) -> Result<usize, String> {
    let bad = || format!("expected a positive integer such as 4194304 or 2^22, got '{text}'");
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

/// `--repeats`: a count of at most [`MAX_REPEATS`].
fn repeats(text: &str) -> Result<usize, String> {
    let k = count(text)?;
    if k > MAX_REPEATS {
        return Err(format!("at most {MAX_REPEATS} repetitions, got {k}"));
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn counts_read_powers_and_shifts() {
        assert_eq!(count("2^22"), Ok(1 << 22));
        assert_eq!(count("1<<10"), Ok(1024));
        assert_eq!(count("4_096"), Ok(4096));
        for bad in ["0", "-1", "1e9", "2^99", "x"] {
            assert!(count(bad).is_err(), "{bad}");
        }
        assert!(repeats("1000001").is_err());
        assert_eq!(repeats("1000000"), Ok(MAX_REPEATS));
    }
}
