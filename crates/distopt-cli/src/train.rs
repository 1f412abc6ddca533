//! `distopt train`: R simulated ranks train a small model on a synthetic data set split across
//! them, with synchronous SGD, post-local SGD with periodic averaging and post-local SGD with
//! hierarchical averaging, and compare loss, divergence between replicas and communication.
//!
//! The training itself is `distopt::train` (shared with the browser demo); this file parses
//! options, times the steps, draws the progress bar and prints the comparison.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distopt::backend::{BackendChoice, Selection, select_backend_blocking};
use distopt::comm::Communicator;
use distopt::diloco::Compression;
use distopt::train::{Algorithm, Evaluation, SyntheticTask, TaskConfig, TrainConfig, Trainer};
use distopt::{Error, warnings};
use serde_json::{Value, json};

use crate::{USAGE, take_flag, take_option};

/// Steps whose training loss the table's "train loss" averages (the last ones).
const SMOOTHING_STEPS: usize = 10;
/// Characters of the progress bar.
const BAR_WIDTH: usize = 30;

/// `distopt train ARGS` in a simulated world.
pub fn run(args: &[String]) -> Result<(), Error> {
    run_in(args, None)
}

/// `distopt train ARGS`, in `world` when given (one rank per process under `mpirun`: the same
/// flags, `--ranks` defaulting to the world size; the first rank prints the report).
pub fn run_in(args: &[String], world: Option<Arc<dyn Communicator>>) -> Result<(), Error> {
    let mut options = Options::from_args(args)?;
    if let Some(world) = &world {
        let size = world.world_size();
        if args.iter().any(|a| a == "--ranks") && options.ranks != size {
            return Err(Error::value(format!(
                "--ranks {} contradicts the world of {size} processes: drop --ranks or start {} processes",
                options.ranks, options.ranks
            )));
        }
        options.ranks = size;
        options.rebuild_hierarchy();
        options.processes = Some(size);
    }
    let selection = select_backend_blocking(options.choice)?;
    let task = Arc::new(SyntheticTask::new(options.task.clone(), options.ranks)?);
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
    if world.as_ref().is_some_and(|w| w.local_ranks().start != 0) {
        return Ok(());
    }
    if options.json {
        println!("{}", to_json(&options, &selection, &task, &results));
    } else {
        print!("{}", to_table(&options, &selection, &task, &results));
    }
    Ok(())
}

/// The command line, parsed.
struct Options {
    ranks: usize,
    /// Processes of an MPI world (one rank each), when run under `mpirun`.
    processes: Option<usize>,
    steps: u64,
    period: u64,
    warmup: u64,
    algorithms: Vec<Algorithm>,
    choice: BackendChoice,
    task: TaskConfig,
    train: TrainConfig,
    json: bool,
}

fn parse<T: std::str::FromStr>(name: &str, text: &str, what: &str) -> Result<T, Error> {
    text.trim()
        .parse()
        .map_err(|_| Error::value(format!("{name}: expected {what}, got '{text}'")))
}

impl Options {
    fn from_args(args: &[String]) -> Result<Options, Error> {
        let mut args = args.to_vec();
        let mut take = |name: &str| take_option(&mut args, name);
        let count = "a non-negative integer";
        let ranks: usize = match take("--ranks")? {
            Some(t) => parse("--ranks", &t, count)?,
            None => 8,
        };
        let steps: u64 = match take("--steps")? {
            Some(t) => parse("--steps", &t, count)?,
            None => 200,
        };
        let lr: f64 = match take("--lr")? {
            Some(t) => parse("--lr", &t, "a number")?,
            None => TrainConfig::default().lr,
        };
        let momentum: f64 = match take("--momentum")? {
            Some(t) => parse("--momentum", &t, "a number")?,
            None => TrainConfig::default().momentum,
        };
        let batch_size: usize = match take("--batch")? {
            Some(t) => parse("--batch", &t, count)?,
            None => TrainConfig::default().batch_size,
        };
        let period: u64 = match take("--period")? {
            Some(t) => parse("--period", &t, count)?,
            None => 8,
        };
        let warmup: u64 = match take("--warmup")? {
            Some(t) => parse("--warmup", &t, count)?,
            None => 20,
        };
        let fragments: usize = match take("--fragments")? {
            Some(t) => parse("--fragments", &t, count)?,
            None => 1,
        };
        let compress = match take("--compress")? {
            Some(t) => Compression::parse(&t).map_err(|_| {
                Error::value(format!("--compress must be bf16, f16 or none, got '{t}'"))
            })?,
            None => Compression::None,
        };
        let algorithm = take("--algorithm")?.unwrap_or_else(|| "all".into());
        let choice = BackendChoice::parse(&take("--backend")?.unwrap_or_else(|| "auto".into()))?;
        let seed: u64 = match take("--seed")? {
            Some(t) => parse("--seed", &t, count)?,
            None => 0,
        };
        let samples: usize = match take("--samples")? {
            Some(t) => parse("--samples", &t, count)?,
            None => TaskConfig::default().samples,
        };
        let heterogeneity: f64 = match take("--heterogeneity")? {
            Some(t) => parse("--heterogeneity", &t, "a number in [0, 1]")?,
            None => TaskConfig::default().heterogeneity,
        };
        let json = take_flag(&mut args, "--json");
        if let Some(unknown) = args.first() {
            return Err(Error::value(format!(
                "train: unexpected argument {unknown}\n{USAGE}"
            )));
        }
        if ranks == 0 {
            return Err(Error::value("--ranks must be at least 1"));
        }
        if steps == 0 {
            return Err(Error::value("--steps must be at least 1"));
        }
        if period == 0 {
            return Err(Error::value("--period must be at least 1"));
        }
        let periodic = Algorithm::PostLocalPeriodic { period, warmup };
        let hierarchical = Algorithm::PostLocalHierarchical {
            levels: Algorithm::default_hierarchy(period, ranks),
            warmup,
            subgroup_size: None,
        };
        if !compress.is_none() && algorithm != "diloco" {
            return Err(Error::value(
                "--compress applies to --algorithm diloco only",
            ));
        }
        let diloco = Algorithm::DiLoCo {
            sync_every: period,
            fragments,
            compress,
        };
        let algorithms = match algorithm.as_str() {
            "sync" => vec![Algorithm::SyncSgd],
            "periodic" => vec![periodic],
            "hierarchical" => vec![hierarchical],
            "zero" => vec![Algorithm::Zero],
            "diloco" => vec![diloco],
            "all" => vec![
                Algorithm::SyncSgd,
                periodic,
                hierarchical,
                Algorithm::Zero,
                diloco,
            ],
            other => {
                return Err(Error::value(format!(
                    "unknown algorithm '{other}': expected sync, periodic, hierarchical, zero, diloco or all"
                )));
            }
        };
        Ok(Options {
            ranks,
            processes: None,
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
    task: &Arc<SyntheticTask>,
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
    let mut trainer = match world {
        Some(world) => Trainer::with_world(selection.backend.clone(), task.clone(), config, world)?,
        None => Trainer::new(selection.backend.clone(), task.clone(), config)?,
    };
    for warning in warnings::take() {
        eprintln!("distopt: warning: {warning}");
    }
    let initial = trainer.evaluate_blocking()?;
    let mut bar = Progress::new(algorithm.name(), options.steps);
    bar.enabled &= first_rank;
    let mut mean_loss = Vec::new();
    let mut divergence = Vec::new();
    let mut steps_averaged = 0;
    let mut elapsed = Duration::ZERO;
    for _ in 0..options.steps {
        let start = Instant::now();
        let report = trainer.step_blocking()?;
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
    let stats = trainer.comm_stats();
    let evaluation = trainer.evaluate_blocking()?;
    Ok(RunResult {
        algorithm,
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

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
struct Progress {
    label: String,
    total: u64,
    enabled: bool,
    smoothed: Option<f64>,
    drawn: bool,
}

impl Progress {
    fn new(label: &str, total: u64) -> Progress {
        Progress {
            label: label.to_string(),
            total,
            enabled: std::io::stderr().is_terminal(),
            smoothed: None,
            drawn: false,
        }
    }

    fn update(&mut self, step: u64, loss: f64) {
        let smoothed = match self.smoothed {
            Some(s) => 0.9 * s + 0.1 * loss,
            None => loss,
        };
        self.smoothed = Some(smoothed);
        // About 200 redraws per run at most.
        let every = (self.total / 200).max(1);
        if !self.enabled || (!step.is_multiple_of(every) && step != self.total) {
            return;
        }
        let filled = (step as u128 * BAR_WIDTH as u128 / self.total.max(1) as u128) as usize;
        let bar: String = (0..BAR_WIDTH)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r{:<12} [{bar}] {step}/{} loss {smoothed:.3}   ",
            self.label, self.total
        );
        let _ = err.flush();
        self.drawn = true;
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
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

fn describe_task(task: &SyntheticTask) -> String {
    let c = task.config();
    let dominant: usize = (0..task.ranks())
        .map(|r| {
            task.class_counts(r)
                .get(r % c.classes)
                .copied()
                .unwrap_or(0)
        })
        .sum();
    format!(
        "MLP {}-{}-{} ({} parameters) on {} samples of {} Gaussian-cluster classes, {} per rank; \
         {:.0}% of a rank's samples are of its own class (heterogeneity {})",
        c.features,
        c.hidden,
        c.classes,
        task.num_params(),
        c.samples,
        c.classes,
        task.shard_len(0),
        100.0 * dominant as f64 / c.samples as f64,
        c.heterogeneity
    )
}

fn to_table(
    options: &Options,
    selection: &Selection,
    task: &SyntheticTask,
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
            ", one per MPI process"
        } else {
            ""
        },
        options.steps,
        if options.steps == 1 { "" } else { "s" },
        t.lr,
        t.momentum,
        t.batch_size
    );
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
         model loss   loss and accuracy of the mean of the replicas on all {} samples\n\
         divergence   largest L2 distance of a replica from that mean, after the last step\n\
         sent/rank    bytes each rank sent: all-reduces (a ring all-reduce over g ranks \
         sends 2(g-1)/g of the tensor) and, for zero, the owners' broadcasts\n\
         world-level  the part of them sent in all-reduces over all {} ranks\n\
         ms/step      wall time of a step: host gradients, upload, all-reduces, SGD, readback\n\
         averaged     steps that averaged the parameters\n\n",
        task.config().samples,
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
    task: &SyntheticTask,
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
        "steps": options.steps,
        "period": options.period,
        "warmup": options.warmup,
        "backend": {
            "kind": format!("{:?}", info.kind),
            "name": info.name,
            "reason": selection.reason,
        },
        "task": {
            "config": serde_json::to_value(task.config()).unwrap_or(Value::Null),
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
