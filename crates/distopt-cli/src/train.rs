//! `distopt train`: R simulated ranks train a small model on a synthetic data set split across
//! them, with synchronous SGD, post-local SGD with periodic averaging and post-local SGD with
//! hierarchical averaging, and compare loss, divergence between replicas and communication.
//!
//! The training itself is `distopt::train` (shared with the browser demo); this file parses
//! options, times the steps, draws the progress bar and prints the comparison.

use crate::output::{out, outln};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use distopt::BlockOn;
use distopt::backend::{BackendChoice, Selection, select_backend};
use distopt::comm::{Communicator, MembershipSchedule, SimulatedWorld};
use distopt::diloco::Compression;
use distopt::train::{
    Algorithm, AlgorithmName, AlgorithmSettings, Dataset, DatasetConfig, DatasetTask, Evaluation,
    SyntheticTask, Task, TaskConfig, TrainConfig, Trainer,
};
use distopt::{Error, warnings};
use serde_json::{Value, json};

use crate::args::{TrainArgs, TrainTask};
use crate::finish::Finish;

/// Steps whose training loss the table's "train loss" averages (the last ones).
const SMOOTHING_STEPS: usize = 10;

/// The algorithms whose runs a process can join (`--join`): their sync points admit ranks.
const ELASTIC: [&str; 3] = ["diloco", "periodic", "hierarchical"];

/// `distopt train ARGS`: in a simulated world, or with `--world` as one rank of a NATS run.
pub fn run(args: TrainArgs) -> Result<(), Error> {
    if args.world.world.is_none() {
        return run_in(args, None);
    }
    // Refused before the run is touched: a joiner takes a rank's claim.
    if args.world.join && !ELASTIC.contains(&args.algorithm.as_str()) {
        return Err(Error::value(format!(
            "--join takes a process into a running run of an elastic algorithm (diloco, periodic or hierarchical: their sync points admit and heal it): give it the run's flags with one of them, not '{}'",
            args.algorithm
        )));
    }
    let nats = crate::world::join_nats(&args.world, args.ranks)?;
    #[cfg(feature = "nats")]
    leave_when_interrupted(&nats);
    let world: Arc<dyn Communicator> = nats.clone();
    let (rank, ranks) = (world.local_ranks().start, world.world_size());
    let trained = run_in(args, Some(world))
        .map_err(|e| Error::new(e.kind(), format!("rank {rank} of {ranks}: {}", e.message())));
    // Who left and who joined, where this process saw it: the run's membership schedule, and
    // when this process learnt each agreement (Unix time: `distopt bench recovery` compares
    // it with a kill's).
    #[cfg(feature = "nats")]
    for (change, agreed) in nats.timed_membership_changes() {
        let list = |ranks: &[usize]| {
            ranks
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let live: Vec<usize> = change.live_ranks().collect();
        let mut said = format!(
            "distopt: run '{}' sync point {}: live ranks {}",
            nats.run(),
            change.epoch,
            list(&live)
        );
        if !change.joining.is_empty() {
            said += &format!(
                "; rank(s) {} joined (healed from rank {})",
                list(&change.joining),
                change.source().unwrap_or(0)
            );
        }
        let unix = agreed
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        said += &format!("; agreed at {:.3}", unix.as_secs_f64());
        eprintln!("{said}");
    }
    // Frames published in another rank's name were dropped, never used: the run's results
    // stand, but someone with access to the run tried, and the user should know.
    #[cfg(feature = "nats")]
    if nats.forged_frames() > 0 {
        eprintln!(
            "warning: rank {rank} of run '{}' dropped {} frames that another client published in other ranks' names (their seals are not those ranks' keys)",
            nats.run(),
            nats.forged_frames()
        );
    }
    trained
}

/// Makes an interrupt (Ctrl-C, SIGTERM) tell `world`'s run that this rank leaves, so that the
/// other ranks go on without it half a second later instead of after the failure bound; the
/// process then exits with status 130.
#[cfg(feature = "nats")]
fn leave_when_interrupted(world: &Arc<distopt::comm::NatsWorld>) {
    // Weak: the world is still dropped (and leaves) when the run ends without an interrupt.
    let world = Arc::downgrade(world);
    let handler = ctrlc::set_handler(move || {
        if let Some(world) = world.upgrade() {
            world.leave();
        }
        eprintln!("distopt: interrupted: this rank left its run");
        std::process::exit(130);
    });
    if let Err(e) = handler {
        eprintln!("distopt: warning: an interrupt will not tell the run this rank leaves: {e}");
    }
}

/// `distopt train ARGS`, in `world` when given (one rank per process under `mpirun` or over
/// NATS: the same flags, `--ranks` defaulting to the world size; the lowest rank that finished
/// prints the report, which under DiLoCo and the averagers need not be rank 0).
pub fn run_in(args: TrainArgs, world: Option<Arc<dyn Communicator>>) -> Result<(), Error> {
    let ranks_given = args.ranks.is_some();
    let mut options = Options::from_args(args)?;
    if let Some(world) = &world {
        if options.membership.is_some() {
            return Err(Error::value(
                "--membership replays a schedule in the simulated world; a world of processes has the membership of its live processes",
            ));
        }
        let size = world.world_size();
        if ranks_given && options.ranks != size {
            return Err(Error::value(format!(
                "--ranks {} contradicts the world of {size} processes: drop --ranks or start {} processes",
                options.ranks, options.ranks
            )));
        }
        options.ranks = size;
        options.rebuild_hierarchy();
        options.processes = Some(size);
    }
    let selection = select_backend(options.choice).block_on()?;
    let task: Arc<dyn Task> = match options.task_kind {
        TrainTask::Synthetic => Arc::new(SyntheticTask::new(options.task.clone(), options.ranks)?),
        TrainTask::Digits => Arc::new(DatasetTask::new(
            &Dataset::digits()?,
            options.dataset.clone(),
            options.ranks,
        )?),
    };
    let mut results = Vec::with_capacity(options.algorithms.len());
    for algorithm in &options.algorithms {
        results.push(train_one(
            &selection,
            &task,
            &options,
            algorithm.clone(),
            world.clone(),
        )?);
    }
    if options.finish.is_some() {
        options.steps = results.iter().map(|r| r.steps).max().unwrap_or(0);
    }
    if let Some(world) = &world {
        // A last agreement point: the ranks that finished (every rank, unless some left an
        // elastic run); the lowest of them prints.
        let live = world.membership()?.live;
        let finished: Vec<usize> = (0..live.len()).filter(|&r| live[r]).collect();
        if finished.first() != Some(&world.local_ranks().start) {
            return Ok(());
        }
        options.ranks_finished = Some(finished);
    }
    if options.json {
        outln!("{}", to_json(&options, &selection, task.as_ref(), &results));
    } else {
        out!(
            "{}",
            to_table(&options, &selection, task.as_ref(), &results)
        );
    }
    Ok(())
}

/// The command line, parsed.
struct Options {
    /// The data set (`--task`).
    task_kind: TrainTask,
    /// The digits task's settings (`--task digits`).
    dataset: DatasetConfig,
    ranks: usize,
    /// Processes of an MPI world (one rank each), when run under `mpirun`.
    processes: Option<usize>,
    /// In a world of processes, the ranks that finished training (those that did not leave).
    ranks_finished: Option<Vec<usize>>,
    /// `--join`: this process joins the running run (an elastic algorithm only).
    join: bool,
    steps: u64,
    period: u64,
    warmup: u64,
    algorithms: Vec<Algorithm>,
    choice: BackendChoice,
    task: TaskConfig,
    train: TrainConfig,
    /// `--membership`: the simulated world's membership schedule.
    membership: Option<MembershipSchedule>,
    /// `--finish-on-stdin`: the step to end at, told on stdin.
    finish: Option<Finish>,
    json: bool,
}

impl Options {
    fn from_args(args: TrainArgs) -> Result<Options, Error> {
        let train_defaults = TrainConfig::default();
        let task_defaults = TaskConfig::default();
        let ranks = args.ranks.unwrap_or(8);
        let (steps, period, warmup, fragments, seed) = (
            args.steps,
            args.period,
            args.warmup,
            args.fragments,
            args.seed,
        );
        let lr = args.lr.unwrap_or(train_defaults.lr);
        let momentum = args.momentum.unwrap_or(train_defaults.momentum);
        let batch_size = args.batch.unwrap_or(train_defaults.batch_size);
        if args.task == TrainTask::Digits && args.samples.is_some() {
            return Err(Error::value(
                "--samples sets the synthetic task's size; the digits are 1,797 images",
            ));
        }
        let samples = args.samples.unwrap_or(task_defaults.samples);
        let heterogeneity = args.heterogeneity.unwrap_or(task_defaults.heterogeneity);
        let compress = match &args.compress {
            Some(t) => Compression::parse(t).map_err(|_| {
                Error::value(format!("--compress must be bf16, f16 or none, got '{t}'"))
            })?,
            None => Compression::None,
        };
        let algorithm = args.algorithm;
        if args.finish_on_stdin && algorithm == "all" {
            return Err(Error::value(
                "--finish-on-stdin ends one algorithm's run: give --algorithm",
            ));
        }
        let choice = args.backend;
        let json = args.json;
        if ranks == 0 {
            return Err(Error::value("--ranks must be at least 1"));
        }
        if steps == 0 {
            return Err(Error::value("--steps must be at least 1"));
        }
        if period == 0 {
            return Err(Error::value("--period must be at least 1"));
        }
        if !compress.is_none() && algorithm != "diloco" {
            return Err(Error::value(
                "--compress applies to --algorithm diloco only",
            ));
        }
        if algorithm != "diloco" {
            for (given, flag) in [
                (args.fragment_sync_delay.is_some(), "--fragment-sync-delay"),
                (
                    args.fragment_update_alpha.is_some(),
                    "--fragment-update-alpha",
                ),
            ] {
                if given {
                    return Err(Error::value(format!(
                        "{flag} applies to --algorithm diloco only"
                    )));
                }
            }
        }
        let mut settings = AlgorithmSettings::default();
        settings.period = period;
        settings.warmup = warmup;
        settings.fragments = fragments;
        settings.compress = compress;
        settings.fragment_sync_delay = args.fragment_sync_delay.unwrap_or(0);
        settings.fragment_update_alpha = args.fragment_update_alpha;
        let names = match algorithm.as_str() {
            "all" => AlgorithmName::ALL.to_vec(),
            name => vec![
                name.parse::<AlgorithmName>()
                    .map_err(|e| Error::value(format!("{}, or all", e.message())))?,
            ],
        };
        let algorithms = names
            .into_iter()
            .map(|name| name.build(&settings, ranks))
            .collect::<Result<Vec<_>, Error>>()?;
        let membership = args
            .membership
            .as_deref()
            .map(|text| MembershipSchedule::parse(ranks, text))
            .transpose()
            .map_err(|e| Error::value(format!("--membership: {}", e.message())))?;
        Ok(Options {
            task_kind: args.task,
            dataset: DatasetConfig {
                heterogeneity: args
                    .heterogeneity
                    .unwrap_or(DatasetConfig::default().heterogeneity),
                seed,
                ..DatasetConfig::default()
            },
            ranks,
            processes: None,
            ranks_finished: None,
            join: args.world.join,
            steps,
            period,
            warmup,
            algorithms,
            choice,
            task: TaskConfig {
                samples,
                heterogeneity,
                seed,
                ..TaskConfig::default()
            },
            train: TrainConfig {
                algorithm: Algorithm::SyncSgd,
                lr,
                momentum,
                batch_size,
                seed,
            },
            membership,
            finish: args.finish_on_stdin.then(|| Finish::from_stdin(steps)),
            json,
        })
    }
}

impl Options {
    /// Recomputes the default hierarchy after `ranks` changed.
    fn rebuild_hierarchy(&mut self) {
        for algorithm in &mut self.algorithms {
            if let Algorithm::PostLocalHierarchical { levels, .. } = algorithm {
                *levels = Algorithm::default_hierarchy(self.period, self.ranks);
            }
        }
    }
}

/// One algorithm's run.
struct RunResult {
    algorithm: Algorithm,
    /// The steps the run ended at (`--steps`, or the step told with `--finish-on-stdin`).
    steps: u64,
    mean_loss: Vec<f64>,
    divergence: Vec<f64>,
    steps_averaged: u64,
    bytes_per_rank: u64,
    bytes_by_group_size: BTreeMap<usize, u64>,
    elapsed: Duration,
    initial: Evaluation,
    evaluation: Evaluation,
}

impl RunResult {
    fn train_loss(&self) -> f64 {
        let tail = &self.mean_loss[self.mean_loss.len().saturating_sub(SMOOTHING_STEPS)..];
        tail.iter().sum::<f64>() / tail.len().max(1) as f64
    }

    fn final_divergence(&self) -> f64 {
        self.divergence.last().copied().unwrap_or(0.0)
    }

    fn ms_per_step(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e3 / self.mean_loss.len().max(1) as f64
    }
}

fn train_one(
    selection: &Selection,
    task: &Arc<dyn Task>,
    options: &Options,
    algorithm: Algorithm,
    world: Option<Arc<dyn Communicator>>,
) -> Result<RunResult, Error> {
    let config = TrainConfig {
        algorithm: algorithm.clone(),
        ..options.train.clone()
    };
    warnings::take();
    let first_rank = world.as_ref().is_none_or(|w| w.local_ranks().start == 0);
    // Each algorithm replays the schedule from its first sync point.
    let world = match (world, &options.membership) {
        (None, Some(schedule)) => {
            Some(Arc::new(SimulatedWorld::with_schedule(schedule.clone())?) as Arc<dyn Communicator>)
        }
        (world, _) => world,
    };
    let mut trainer = match world {
        Some(world) if options.join => {
            Trainer::joining(selection.backend.clone(), task.clone(), config, world)?
        }
        Some(world) => Trainer::with_world(selection.backend.clone(), task.clone(), config, world)?,
        None => Trainer::new(selection.backend.clone(), task.clone(), config)?,
    };
    for warning in warnings::take() {
        eprintln!("distopt: warning: {warning}");
    }
    if options.join {
        // Taken in at the run's next sync point and healed there; the evaluation below then
        // reads the healed parameters already read back (no collective of its own).
        trainer.admit().block_on()?;
    }
    let initial = trainer.evaluate().block_on()?;
    let mut bar = Progress::new(algorithm.name(), options.steps, first_rank);
    let mut mean_loss = Vec::new();
    let mut divergence = Vec::new();
    let mut steps_averaged = 0;
    let mut elapsed = Duration::ZERO;
    let more = |steps: u64| match &options.finish {
        Some(finish) => finish.more(steps),
        None => steps < options.steps,
    };
    while more(trainer.steps()) {
        let start = Instant::now();
        let report = trainer.step().block_on()?;
        elapsed += start.elapsed();
        if !report.mean_loss.is_finite() {
            bar.finish();
            return Err(Error::value(format!(
                "{}: training diverged (loss {} at step {}); try a smaller --lr",
                algorithm.name(),
                report.mean_loss,
                report.step
            )));
        }
        steps_averaged += u64::from(report.averaged.is_some());
        mean_loss.push(report.mean_loss);
        divergence.push(report.divergence);
        bar.update(report.step, report.mean_loss);
    }
    bar.finish();
    let steps = trainer.steps();
    let stats = trainer.comm_stats();
    let evaluation = trainer.evaluate().block_on()?;
    Ok(RunResult {
        algorithm,
        steps,
        mean_loss,
        divergence,
        steps_averaged,
        bytes_per_rank: stats.total_bytes(),
        bytes_by_group_size: stats.all_reduce_bytes_by_group_size,
        elapsed,
        initial,
        evaluation,
    })
}

/// The training progress bar (stderr, only on a terminal): steps, steps per second, the time
/// left and the smoothed loss.
struct Progress {
    bar: indicatif::ProgressBar,
    smoothed: Option<f64>,
}

impl Progress {
    fn new(label: &str, total: u64, enabled: bool) -> Progress {
        Progress {
            bar: crate::progress::bar(label, total, "steps", enabled),
            smoothed: None,
        }
    }

    fn update(&mut self, step: u64, loss: f64) {
        let smoothed = match self.smoothed {
            Some(s) => 0.9 * s + 0.1 * loss,
            None => loss,
        };
        self.smoothed = Some(smoothed);
        self.bar.set_message(format!("loss {smoothed:.3}"));
        self.bar.set_position(step);
    }

    fn finish(&mut self) {
        self.bar.finish();
    }
}

/// `1234567` → `1.18 MiB`.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

fn describe_task(task: &dyn Task) -> String {
    let classes = task.classes();
    let samples: usize = (0..task.ranks()).map(|r| task.shard_len(r)).sum();
    // A rank's "own" class is the one it holds most of: the skew of a non-IID split.
    let dominant: usize = (0..task.ranks())
        .map(|r| task.class_counts(r).into_iter().max().unwrap_or(0))
        .sum();
    format!(
        "{} ({} parameters); {:.0}% of a rank's samples are of its most common class (of {classes})",
        task.describe(),
        task.num_params(),
        100.0 * dominant as f64 / samples.max(1) as f64,
    )
}

fn to_table(
    options: &Options,
    selection: &Selection,
    task: &dyn Task,
    results: &[RunResult],
) -> String {
    let info = selection.backend.info();
    let t = &options.train;
    let mut out = String::new();
    out += &format!(
        "distopt train: {} rank{}{}, {} step{} of SGD (lr {}, momentum {}, batch {} per rank)\n",
        options.ranks,
        if options.ranks == 1 { "" } else { "s" },
        if options.processes.is_some() {
            ", one per process"
        } else {
            ""
        },
        options.steps,
        if options.steps == 1 { "" } else { "s" },
        t.lr,
        t.momentum,
        t.batch_size
    );
    if let Some(finished) = options
        .ranks_finished
        .as_ref()
        .filter(|f| f.len() < options.ranks)
    {
        let left: Vec<String> = (0..options.ranks)
            .filter(|r| !finished.contains(r))
            .map(|r| r.to_string())
            .collect();
        out += &format!(
            "ranks that left the run: {}; the {} others finished it\n",
            left.join(", "),
            finished.len()
        );
    }
    out += &format!("task: {}\n", describe_task(task));
    out += &format!(
        "backend: {:?} ({}), because {}\n",
        info.kind, info.name, selection.reason
    );
    if let Some(first) = results.first() {
        out += &format!(
            "initial model: loss {:.4}, accuracy {:.1}%\n",
            first.initial.mean_model_loss,
            100.0 * first.initial.mean_model_accuracy
        );
    }
    out += "\n";
    let header = [
        "algorithm",
        "train loss",
        "model loss",
        "accuracy",
        "divergence",
        "sent/rank",
        "world-level",
        "ms/step",
        "averaged",
    ];
    let mut rows = vec![header.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    for r in results {
        let world = r
            .bytes_by_group_size
            .get(&options.ranks)
            .copied()
            .unwrap_or(0);
        rows.push(vec![
            r.algorithm.name().to_string(),
            format!("{:.4}", r.train_loss()),
            format!("{:.4}", r.evaluation.mean_model_loss),
            format!("{:.1}%", 100.0 * r.evaluation.mean_model_accuracy),
            if r.final_divergence() == 0.0 {
                "0".to_string()
            } else {
                format!("{:.4}", r.final_divergence())
            },
            human_bytes(r.bytes_per_rank),
            human_bytes(world),
            format!("{:.2}", r.ms_per_step()),
            match r.algorithm {
                Algorithm::SyncSgd | Algorithm::Zero => "-".to_string(),
                _ => format!("{}/{}", r.steps_averaged, r.mean_loss.len()),
            },
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|row| row[c].len()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c == 0 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        out += cells.join("  ").trim_end();
        out += "\n";
    }
    out += &format!(
        "\ntrain loss   mean over ranks of the mini-batch loss, last {SMOOTHING_STEPS} steps\n\
         model loss   loss and accuracy of the mean of the replicas on {}\n\
         divergence   largest L2 distance of a replica from that mean, after the last step\n\
         sent/rank    bytes each rank sent: all-reduces (a ring all-reduce over g ranks \
         sends 2(g-1)/g of the tensor) and, for zero, the owners' broadcasts\n\
         world-level  the part of them sent in all-reduces over all {} ranks\n\
         ms/step      wall time of a step: host gradients, upload, all-reduces, SGD, readback\n\
         averaged     steps that averaged the parameters\n\n",
        results.first().map_or_else(String::new, |r| {
            let e = &r.initial;
            if e.held_out {
                format!("the {} held-out samples", e.samples)
            } else {
                format!("all {} samples", e.samples)
            }
        }),
        options.ranks
    );
    for r in results {
        out += &format!("  {:<12} {}\n", r.algorithm.name(), r.algorithm.describe());
    }
    out
}

fn to_json(
    options: &Options,
    selection: &Selection,
    task: &dyn Task,
    results: &[RunResult],
) -> Value {
    let info = selection.backend.info();
    let runs: Vec<Value> = results
        .iter()
        .map(|r| {
            let by_group: serde_json::Map<String, Value> = r
                .bytes_by_group_size
                .iter()
                .map(|(g, b)| (g.to_string(), json!(b)))
                .collect();
            json!({
                "algorithm": r.algorithm.name(),
                "description": r.algorithm.describe(),
                "settings": serde_json::to_value(&r.algorithm).unwrap_or(Value::Null),
                "final_mean_loss": r.mean_loss.last(),
                "train_loss": r.train_loss(),
                "initial_model_loss": r.initial.mean_model_loss,
                "mean_model_loss": r.evaluation.mean_model_loss,
                "mean_model_accuracy": r.evaluation.mean_model_accuracy,
                "replica_loss_per_rank": r.evaluation.loss_per_rank,
                "divergence": r.final_divergence(),
                "bytes_communicated_per_rank": r.bytes_per_rank,
                "all_reduce_bytes_by_group_size": by_group,
                "steps_averaged": r.steps_averaged,
                "ms_per_step": r.ms_per_step(),
                "mean_loss_per_step": r.mean_loss,
                "divergence_per_step": r.divergence,
            })
        })
        .collect();
    json!({
        "ranks": options.ranks,
        "ranks_finished": options.ranks_finished,
        "steps": options.steps,
        "period": options.period,
        "warmup": options.warmup,
        "backend": {
            "kind": format!("{:?}", info.kind),
            "name": info.name,
            "reason": selection.reason,
        },
        "task": {
            "name": task.name(),
            "description": task.describe(),
            "config": match options.task_kind {
                TrainTask::Synthetic => serde_json::to_value(&options.task).unwrap_or(Value::Null),
                TrainTask::Digits => serde_json::to_value(&options.dataset).unwrap_or(Value::Null),
            },
            "parameters": task.num_params(),
            "samples_per_rank": (0..task.ranks()).map(|r| task.shard_len(r)).collect::<Vec<_>>(),
        },
        "train": {
            "lr": options.train.lr,
            "momentum": options.train.momentum,
            "batch_size": options.train.batch_size,
            "seed": options.train.seed,
        },
        "results": runs,
    })
}
