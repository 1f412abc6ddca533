//! `distopt bench overlap`, as W processes of `--world nats://…`: Streaming DiLoCo training the
//! demo's task, its fragment all-reduce in flight during `--fragment-sync-delay` inner steps,
//! against the same processes training with no communication at all (no sync point within the
//! timed steps) and with the same syncs blocking (no delay), timed in the same run. Each row is
//! the slowest process's wall-clock time per inner step, the median of `--repeats` rounds that
//! alternate the three. No report is gathered during the timed steps
//! (`Trainer::train_unreported`): the only traffic is DiLoCo's.

use crate::output::outln;
use std::sync::Arc;
use std::time::Instant;

use distopt::comm::{Communicator, all_gather_f64};
use distopt::train::{Algorithm, SyntheticTask, Task, TaskConfig, TrainConfig, Trainer};
use distopt::{BlockOn, CpuBackend, Error};
use serde_json::json;

use crate::args::BenchOverlapArgs;

/// Inner steps between syncs of the no-communication row: none falls in a round.
const NEVER: u64 = 1 << 40;

/// `distopt bench overlap ARGS` on every rank of `world`; the first rank prints.
///
/// # Errors
/// A `ValueError` for a delay the schedule does not allow; the world's and the trainer's.
pub fn run(args: BenchOverlapArgs, world: Arc<dyn Communicator>) -> Result<(), Error> {
    let ranks = world.world_size();
    let task: Arc<dyn Task> = Arc::new(SyntheticTask::new(TaskConfig::default(), ranks)?);
    let trainer = |sync_every: u64, delay: u64| {
        let config = TrainConfig {
            algorithm: Algorithm::DiLoCo {
                sync_every,
                fragments: args.fragments,
                compress: distopt::diloco::Compression::None,
                fragment_sync_delay: delay,
                fragment_update_alpha: None,
            },
            ..TrainConfig::default()
        };
        Trainer::with_world(
            Arc::new(CpuBackend::with_threads(1)),
            task.clone(),
            config,
            world.clone(),
        )
    };
    let mut rows = [
        ("no communication", trainer(NEVER, 0)?, Vec::new()),
        (
            "syncs blocking (no delay)",
            trainer(args.sync_every as u64, 0)?,
            Vec::new(),
        ),
        (
            "syncs in flight (fragment_sync_delay)",
            trainer(args.sync_every as u64, args.fragment_sync_delay as u64)?,
            Vec::new(),
        ),
    ];
    // One untimed round: the arenas, the state and the connections warm.
    for (_, trainer, _) in &mut rows {
        trainer
            .train_unreported(args.sync_every as u64)
            .block_on()?;
    }
    for _ in 0..args.repeats {
        for (_, trainer, times) in &mut rows {
            all_gather_f64(world.as_ref(), &[Vec::new()])?;
            let start = Instant::now();
            trainer.train_unreported(args.steps as u64).block_on()?;
            let mine = start.elapsed().as_secs_f64() / args.steps as f64;
            let all = all_gather_f64(world.as_ref(), &[vec![mine]])?;
            times.push(all.iter().flatten().copied().fold(0.0, f64::max));
        }
    }
    if world.local_ranks().start != 0 {
        return Ok(());
    }
    let medians: Vec<f64> = rows.iter_mut().map(|(_, _, t)| median(t)).collect();
    let base = medians[0];
    if args.json {
        outln!(
            "{}",
            json!({
                "ranks": ranks,
                "params": task.param_shapes().iter().map(|s| s.iter().product::<usize>()).sum::<usize>(),
                "steps": args.steps,
                "sync_every": args.sync_every,
                "fragments": args.fragments,
                "fragment_sync_delay": args.fragment_sync_delay,
                "repeats": args.repeats,
                "no_communication_us": base * 1e6,
                "blocking_us": medians[1] * 1e6,
                "in_flight_us": medians[2] * 1e6,
                "blocking_ratio": medians[1] / base,
                "in_flight_ratio": medians[2] / base,
            })
        );
        return Ok(());
    }
    outln!(
        "Streaming DiLoCo over NATS: {ranks} processes, the demo's task (synthetic, {} parameters), \
         H {} · F {} · delay {}, {} inner steps, median of {} (slowest process)",
        task.param_shapes()
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum::<usize>(),
        args.sync_every,
        args.fragments,
        args.fragment_sync_delay,
        args.steps,
        args.repeats
    );
    outln!("{:<40} {:>14} {:>10}", "row", "µs/inner step", "ratio");
    for ((name, _, _), m) in rows.iter().zip(&medians) {
        outln!("{name:<40} {:>14.1} {:>9.2}×", m * 1e6, m / base);
    }
    Ok(())
}

fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}
