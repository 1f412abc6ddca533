//! `distopt bench recovery`: how fast an elastic run of processes recovers. W `distopt train
//! --world` processes train on a NATS server; the last rank is SIGKILLed and a `--join`
//! process started in its place. Rank 0's report says when the survivors agreed to go on
//! without it and when they took the joiner in (`; agreed at T`, Unix time); the bench
//! compares those with the kill and with the failure-detection bound. The target is one
//! bound plus one sync period (the run's `ms_per_step` times its period).

use crate::output::outln;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distopt::Error;
use distopt::comm::NatsOptions;
use serde_json::{Value, json};

use crate::args::BenchRecoveryArgs;

/// Steps between two syncs of the runs (`distopt train`'s default `--period`).
const PERIOD: f64 = 8.0;
/// How long a run may take in all before the bench gives up on it.
const DEADLINE: Duration = Duration::from_secs(600);

/// One measured run, in seconds.
struct Recovery {
    /// From the kill to the survivors' agreement on a membership without the killed rank.
    death_to_sync: f64,
    /// From that agreement to the sync point that took the joiner in (its heal).
    left_to_admitted: f64,
    /// From the joiner's start to that sync point.
    join_to_admitted: f64,
    /// One sync period of the run: its time per step times the period.
    sync_period: f64,
}

/// `distopt bench recovery`.
///
/// # Errors
/// A `ValueError` for an algorithm that is not elastic or fewer than 2 processes; a
/// `RuntimeError` when a process cannot start, fails, or does not report the two changes of
/// membership (train longer: `--steps`).
pub fn run(args: &BenchRecoveryArgs) -> Result<(), Error> {
    if !["diloco", "periodic", "hierarchical"].contains(&args.algorithm.as_str()) {
        return Err(Error::value(format!(
            "bench recovery measures an elastic algorithm (diloco, periodic or hierarchical), not '{}'",
            args.algorithm
        )));
    }
    if args.ranks < 2 {
        return Err(Error::value(format!(
            "bench recovery needs at least 2 processes (one survives the kill), not {}",
            args.ranks
        )));
    }
    if !(args.kill_after.is_finite() && args.kill_after >= 0.0) {
        return Err(Error::value(format!(
            "--kill-after must be a non-negative number of seconds, not {}",
            args.kill_after
        )));
    }
    let bound = NatsOptions::new(args.world.clone(), "bound", 1)
        .failure_bound
        .as_secs_f64();
    let mut runs = Vec::with_capacity(args.repeats);
    for i in 0..args.repeats {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let run = format!("recovery-{}-{millis}-{i}", std::process::id());
        runs.push(measure(args, &run)?);
    }
    let median = |f: fn(&Recovery) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let death = median(|r| r.death_to_sync);
    let left = median(|r| r.left_to_admitted);
    let join = median(|r| r.join_to_admitted);
    let period = median(|r| r.sync_period);
    let target = bound + period;
    if args.json {
        let all: Vec<Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "death_to_sync_s": r.death_to_sync,
                    "left_to_admitted_s": r.left_to_admitted,
                    "join_to_admitted_s": r.join_to_admitted,
                    "sync_period_s": r.sync_period,
                })
            })
            .collect();
        outln!(
            "{}",
            json!({
                "bench": "recovery",
                "algorithm": args.algorithm,
                "processes": args.ranks,
                "failure_bound_s": bound,
                "sync_period_s": period,
                "target_s": target,
                "death_to_sync_s": death,
                "left_to_admitted_s": left,
                "join_to_admitted_s": join,
                "runs": all,
            })
        );
    } else {
        outln!(
            "distopt bench recovery: {} {} processes, rank {} SIGKILLed after {} s and a --join process started; median of {} runs\n\
             failure bound {bound:.2} s, one sync period {period:.3} s: target {target:.2} s\n\
             rank death  -> survivors' next sync        {death:7.2} s  {:5.2}x the target\n\
             rank left   -> joiner healed (admitted)    {left:7.2} s  {:5.2}x one sync period\n\
             joiner start -> joiner healed (admitted)   {join:7.2} s  {:5.2}x the target",
            args.ranks,
            args.algorithm,
            args.ranks - 1,
            args.kill_after,
            args.repeats,
            death / target,
            left / period,
            join / target,
        );
    }
    Ok(())
}

/// Seconds since the Unix epoch.
fn unix_now() -> f64 {
    unix(SystemTime::now())
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// One run of `args` named `run`: start, kill, join, wait, read rank 0's report.
fn measure(args: &BenchRecoveryArgs, run: &str) -> Result<Recovery, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::runtime(format!("cannot find this executable: {e}")))?;
    let steps = args.steps.to_string();
    let ranks = args.ranks.to_string();
    let process = |rank: usize, join: bool| {
        let mut command = Command::new(&exe);
        command
            .args(["train", "--algorithm", &args.algorithm, "--steps", &steps])
            .args(["--backend", "cpu", "--json", "--ranks", &ranks])
            .args(["--world", &args.world, "--run", run])
            .args(["--rank", &rank.to_string()]);
        if join {
            command.arg("--join");
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::runtime(format!("cannot start {command:?}: {e}")))
    };
    let mut children = (0..args.ranks)
        .map(|rank| process(rank, false))
        .collect::<Result<Vec<Child>, Error>>()?;
    std::thread::sleep(Duration::from_secs_f64(args.kill_after));
    let killed = args.ranks - 1;
    let mut victim = children.remove(killed);
    let _ = victim.kill();
    let kill = unix_now();
    let _ = victim.wait();
    if let Some(i) = children
        .iter_mut()
        .position(|c| c.try_wait().ok().flatten().is_some())
    {
        let mut stderr = String::new();
        if let Some(mut e) = children[i].stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        return Err(Error::runtime(format!(
            "run '{run}': rank {i} ended before rank {killed} was killed (too few --steps?): {stderr}"
        )));
    }
    children.push(process(killed, true)?);
    let join = unix_now();
    let outputs = wait_all(children)?;
    let (stdout, stderr) = &outputs[0];
    let times = agreements(stderr, run, killed);
    let (Some(left), Some(admitted)) = times else {
        return Err(Error::runtime(format!(
            "run '{run}': rank 0 reported no sync point without rank {killed} and none taking it in again: give it more --steps\n{stderr}"
        )));
    };
    let report: Value = serde_json::from_str(stdout.trim())
        .map_err(|e| Error::runtime(format!("run '{run}': rank 0's report is not JSON: {e}")))?;
    let ms_per_step = report["results"][0]["ms_per_step"]
        .as_f64()
        .ok_or_else(|| {
            Error::runtime(format!("run '{run}': rank 0's report has no ms_per_step"))
        })?;
    Ok(Recovery {
        death_to_sync: left - kill,
        left_to_admitted: admitted - left,
        join_to_admitted: admitted - join,
        sync_period: ms_per_step * PERIOD / 1000.0,
    })
}

/// Every child's stdout and stderr once it ended; a `RuntimeError` naming the first that failed
/// or outlived [`DEADLINE`].
fn wait_all(children: Vec<Child>) -> Result<Vec<(String, String)>, Error> {
    let started = Instant::now();
    let readers: Vec<_> = children
        .into_iter()
        .map(|mut child| {
            std::thread::spawn(move || {
                let mut stdout = String::new();
                let mut stderr = String::new();
                let out = child.stdout.take();
                let reader = std::thread::spawn(move || {
                    let mut s = String::new();
                    if let Some(mut o) = out {
                        let _ = o.read_to_string(&mut s);
                    }
                    s
                });
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut stderr);
                }
                let status = loop {
                    match child.try_wait() {
                        Ok(Some(status)) => break Some(status),
                        Ok(None) if started.elapsed() > DEADLINE => {
                            let _ = child.kill();
                            break None;
                        }
                        Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                        Err(_) => break None,
                    }
                };
                stdout += &reader.join().unwrap_or_default();
                (status, stdout, stderr)
            })
        })
        .collect();
    let mut outputs = Vec::new();
    for (i, reader) in readers.into_iter().enumerate() {
        let (status, stdout, stderr) = reader
            .join()
            .map_err(|_| Error::runtime("a process reader panicked"))?;
        match status {
            Some(s) if s.success() => outputs.push((stdout, stderr)),
            Some(s) => {
                return Err(Error::runtime(format!(
                    "process {i} of the run failed ({s}): {stderr}"
                )));
            }
            None => {
                return Err(Error::runtime(format!(
                    "process {i} of the run did not end within {} s: {stderr}",
                    DEADLINE.as_secs()
                )));
            }
        }
    }
    Ok(outputs)
}

/// When rank 0 learnt the first membership without rank `killed`, and the first that took it
/// in again (Unix seconds), from its report's `sync point K: live ranks …; agreed at T` lines.
fn agreements(stderr: &str, run: &str, killed: usize) -> (Option<f64>, Option<f64>) {
    let prefix = format!("distopt: run '{run}' sync point ");
    let (mut left, mut admitted) = (None, None);
    for line in stderr.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((_, rest)) = line.split_once(": live ranks ") else {
            continue;
        };
        let Some((what, at)) = rest.rsplit_once("; agreed at ") else {
            continue;
        };
        let Ok(at) = at.trim().parse::<f64>() else {
            continue;
        };
        let (live, joined) = what.split_once("; rank(s) ").unwrap_or((what, ""));
        let has = |list: &str| list.split([',', ' ']).any(|r| r == killed.to_string());
        if admitted.is_none() && left.is_some() && has(joined.split(" joined").next().unwrap_or(""))
        {
            admitted = Some(at);
        } else if left.is_none() && !has(live) {
            left = Some(at);
        }
    }
    (left, admitted)
}

#[cfg(test)]
mod tests {
    use super::agreements;

    #[test]
    fn agreements_are_read_from_the_report_lines() {
        let stderr = "distopt: run 'r' sync point 3: live ranks 0,1; agreed at 100.250\n\
                      noise\n\
                      distopt: run 'r' sync point 9: live ranks 0,1; rank(s) 2 joined (healed from rank 0); agreed at 101.5\n";
        assert_eq!(agreements(stderr, "r", 2), (Some(100.25), Some(101.5)));
        // Another run's lines, or a rank that never left, say nothing.
        assert_eq!(agreements(stderr, "other", 2), (None, None));
        assert_eq!(agreements(stderr, "r", 1), (None, None));
    }
}
