//! `distopt bench all`: every benchmark the performance report quotes, each next to its roofline
//! and, with `--torch PYTHON`, next to PyTorch doing the same work in the same run
//! (`bench/peers/*.py`, alternating with distopt's own measurement), as one report.
//!
//! Each benchmark runs as a child process of this executable (`distopt bench … --json`), so a
//! row's allocations and page faults never carry over into the next one.

use crate::output::{out, outln};
use std::path::{Path, PathBuf};
use std::process::Command;

use distopt::Error;
use serde_json::{Value, json};

use crate::args::BenchAllArgs;

/// The step configurations of the report: R, N, dtype.
const STEPS: [(usize, &str, &str); 8] = [
    (4, "2^20", "float32"),
    (4, "2^22", "float32"),
    (8, "2^20", "float32"),
    (8, "2^22", "float32"),
    (4, "2^20", "float16"),
    (4, "2^22", "float16"),
    (8, "2^20", "float16"),
    (8, "2^22", "float16"),
];

/// The optimizer configurations of the report (R = 8, N = 2^22): dtype, parameter count.
const OPTIM: [(&str, &str); 4] = [
    ("float32", "1"),
    ("float32", "1000"),
    ("bfloat16", "1"),
    ("bfloat16", "1000"),
];

fn elements(text: &str) -> usize {
    text.strip_prefix("2^")
        .and_then(|e| e.parse::<u32>().ok())
        .map_or(0, |e| 1usize << e)
}

/// Runs `distopt ARGS --json` and parses its last line.
fn run_self(args: &[&str]) -> Result<Value, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::runtime(format!("cannot find this executable: {e}")))?;
    let out = Command::new(exe)
        .args(args)
        .arg("--json")
        .output()
        .map_err(|e| Error::runtime(format!("distopt {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(Error::runtime(format!(
            "distopt {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    last_json_line(&out.stdout, &format!("distopt {}", args.join(" ")))
}

fn last_json_line(stdout: &[u8], what: &str) -> Result<Value, Error> {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    serde_json::from_str(line)
        .map_err(|e| Error::runtime(format!("{what} printed no JSON last ({e}): {line:?}")))
}

/// PyTorch's fastest path with distopt's arithmetic for that row, from `torch_optim.py`'s
/// `paths`: `fused` for a fused row, otherwise the faster of `foreach` and single-tensor (both
/// round every tensor operation, as distopt's default does).
fn same_arithmetic(paths: &Value, fused: bool) -> Option<f64> {
    if fused {
        return paths["fused"].as_f64();
    }
    [paths["foreach"].as_f64(), paths["single"].as_f64()]
        .into_iter()
        .flatten()
        .reduce(f64::max)
}

/// `--flag value` pairs as the arguments of a command.
fn flags(pairs: &[(&str, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, value)| [flag.to_string(), value.clone()])
        .collect()
}

/// A peer script's last line: a number (`torch_step.py`) or a JSON object (`torch_optim.py`).
fn run_peer(python: &Path, script: &Path, args: &[String]) -> Result<Value, Error> {
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| Error::runtime(format!("{} {}: {e}", python.display(), script.display())))?;
    if !out.status.success() {
        return Err(Error::runtime(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    last_json_line(&out.stdout, &script.display().to_string())
}

/// The repository's `bench/peers/` (this crate lives in `crates/distopt-cli/`).
fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/peers")
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => json!((a / b * 1000.0).round() / 1000.0),
        _ => Value::Null,
    }
}

/// `distopt bench all [--backend B] [--torch PYTHON] [--repeats K] [--json]`.
pub fn run(args: BenchAllArgs) -> Result<(), Error> {
    let backend = args.backend;
    let torch = args.torch;
    let repeats = args.repeats.to_string();
    let json_out = args.json;
    // The step's rows, optim's two and average's one: a child process each.
    let progress = crate::progress::bar(
        "bench all",
        (STEPS.len() + OPTIM.len() + 1) as u64,
        "runs",
        true,
    );
    let peers = peers_dir();
    // `distopt bench ARGS` on this run's backend and repeats.
    let bench = |args: &[&str]| {
        let common = ["--backend", backend.as_str(), "--repeats", repeats.as_str()];
        run_self(&[&["bench"], args, &common].concat())
    };
    let mut steps = Vec::new();
    for (ranks, n, dtype) in STEPS {
        let r = ranks.to_string();
        let ours = bench(&["step", "--ranks", &r, "--elements", n, "--dtype", dtype])?;
        progress.inc(1);
        let peer = match &torch {
            Some(python) => {
                let peer_args = flags(&[
                    ("--ranks", r.clone()),
                    ("--elements", elements(n).to_string()),
                    ("--dtype", dtype.to_string()),
                ]);
                run_peer(python, &peers.join("torch_step.py"), &peer_args)?.as_f64()
            }
            None => None,
        };
        let cpu = ours["cpu_gbps"].as_f64();
        steps.push(json!({
            "ranks": ranks, "elements": n, "dtype": dtype,
            "cpu_oneshot_gbps": cpu, "cpu_shared_gbps": ours["cpu_shared_gbps"],
            "cpu_resident_gbps": ours["cpu_resident_gbps"],
            "cpu_roofline_gbps": ours["cpu_roofline_gbps"],
            "cpu_resident_vs_roofline": ours["cpu_resident_vs_roofline"],
            "gpu_resident_gbps": ours["resident_gbps"], "gpu_oneshot_gbps": ours["oneshot_gbps"],
            "gpu_copy_gbps": ours["copy_gbps"],
            "torch_eager_gbps": peer, "cpu_oneshot_vs_torch": ratio(cpu, peer),
            "detail": ours,
        }));
    }
    let mut optim = Vec::new();
    for (dtype, params) in OPTIM {
        let ours = bench(&["optim", "--dtype", dtype, "--params", params])?;
        progress.inc(1);
        let peer = match &torch {
            Some(python) => Some(run_peer(
                python,
                &peers.join("torch_optim.py"),
                &flags(&[
                    ("--ranks", "8".to_string()),
                    ("--elements", (1usize << 22).to_string()),
                    ("--params", params.to_string()),
                    ("--dtype", dtype.to_string()),
                ]),
            )?),
            None => None,
        };
        let rows = ours["rows"].as_array().cloned().unwrap_or_default();
        for row in rows {
            let kernel = row["kernel"].as_str().unwrap_or_default();
            let name = if kernel.starts_with("Adam") {
                "adam"
            } else {
                "sgd"
            };
            let peer_gbps = peer
                .as_ref()
                .and_then(|p| p[format!("{name}_gbps")].as_f64());
            let same_gbps = peer
                .as_ref()
                .and_then(|p| same_arithmetic(&p["paths"][name], kernel.ends_with("(fused)")));
            optim.push(json!({
                "kernel": kernel, "params": row["params"], "dtype": dtype, "gbps": row["gbps"],
                "roofline_gbps": row["roofline_gbps"], "ratio_to_roofline": row["ratio_to_roofline"],
                "torch_best_gbps": peer_gbps, "vs_torch": ratio(row["gbps"].as_f64(), peer_gbps),
                "torch_same_arithmetic_gbps": same_gbps,
                "vs_torch_same_arithmetic": ratio(row["gbps"].as_f64(), same_gbps),
            }));
        }
    }
    let average = bench(&["average"])?;
    progress.inc(1);
    progress.finish_and_clear();
    let report = json!({
        "report": "distopt bench all",
        "backend": backend,
        "machine": machine(),
        "torch": torch.as_ref().map(|p| p.display().to_string()),
        "step": steps,
        "optim": optim,
        "average": average["rows"],
    });
    if json_out {
        outln!("{report}");
    } else {
        out!("{}", table(&report));
    }
    Ok(())
}

/// The host's processor and core count, for the report's header.
fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    json!({"cpu": cpu, "cores": cores})
}

fn num(v: &Value) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.2}"))
}

fn table(report: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "distopt bench all ({} backend) on {} ({} cores)",
        report["backend"].as_str().unwrap_or_default(),
        report["machine"]["cpu"].as_str().unwrap_or_default(),
        report["machine"]["cores"]
    );
    let _ = writeln!(
        out,
        "\nthe step from host tensors (GB/s of (2R+2)·N·element bytes)\n{:>2} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "R", "N", "dtype", "one-shot", "shared", "resident", "roofline", "torch", "vs torch"
    );
    for s in report["step"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:>2} {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            s["ranks"],
            s["elements"].as_str().unwrap_or_default(),
            s["dtype"].as_str().unwrap_or_default(),
            num(&s["cpu_oneshot_gbps"]),
            num(&s["cpu_shared_gbps"]),
            num(&s["cpu_resident_gbps"]),
            num(&s["cpu_roofline_gbps"]),
            num(&s["torch_eager_gbps"]),
            num(&s["cpu_oneshot_vs_torch"]),
        );
    }
    let _ = writeln!(
        out,
        "\noptimizers, R = 8, N = 2^22 (torch: its fastest path; same: its fastest with this row's arithmetic)\n{:<20} {:>6} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "kernel",
        "params",
        "dtype",
        "GB/s",
        "roofline",
        "vs roof",
        "torch",
        "vs torch",
        "same",
        "vs same"
    );
    for r in report["optim"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:<20} {:>6} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9}",
            r["kernel"].as_str().unwrap_or_default(),
            // A JSON value's Display ignores the width.
            r["params"].to_string(),
            r["dtype"].as_str().unwrap_or_default(),
            num(&r["gbps"]),
            num(&r["roofline_gbps"]),
            num(&r["ratio_to_roofline"]),
            num(&r["torch_best_gbps"]),
            num(&r["vs_torch"]),
            num(&r["torch_same_arithmetic_gbps"]),
            num(&r["vs_torch_same_arithmetic"]),
        );
    }
    let _ = writeln!(out, "\naveraging, R = 8, N = 2^22 float32");
    for r in report["average"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:<28} params {:>5}: {} GB/s, roofline {} GB/s ({})",
            r["kernel"].as_str().unwrap_or_default(),
            r["params"].to_string(),
            num(&r["gbps"]),
            num(&r["roofline_gbps"]),
            num(&r["ratio_to_roofline"]),
        );
    }
    out
}
