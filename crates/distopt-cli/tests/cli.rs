//! The `distopt` binary: `step` reads a request from stdin or a file and prints the result as
//! JSON on every backend; bad input exits non-zero with a message on stderr and nothing on
//! stdout; `info` names the adapter and the backend `auto` picks.

// The root tests' helpers (a GPU backend or a clear skip), shared with the library's tests.
#[path = "../../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const EXAMPLE_1: &str = r#"{"parameter_replicas": [[[1,2]],[[1,2]]], "gradient_replicas": [[[2,4]],[[4,6]]], "learning_rate": 0.1}"#;

fn distopt(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_distopt"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the distopt binary runs");
    {
        let mut pipe = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            // The binary may exit before reading its input (bad options): a closed pipe is
            // no failure of the test.
            match pipe.write_all(text.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("stdin: {e}"),
                _ => {}
            }
        }
    }
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// Runs a step that must succeed and returns its JSON.
fn step_ok(args: &[&str], stdin: Option<&str>) -> Value {
    let out = distopt(args, stdin);
    assert!(
        out.status.success(),
        "distopt {args:?} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_str(&text(&out.stdout)).unwrap_or_else(|e| {
        panic!(
            "distopt {args:?} printed no JSON ({e}): {}",
            text(&out.stdout)
        )
    })
}

fn check_example_1(result: &Value, who: &str) {
    let tensor = |data: Value| json!({"dtype": "float32", "shape": [2], "data": data});
    assert_eq!(
        result,
        &json!({
            "mean_gradients": [tensor(json!([3.0, 5.0]))],
            "updated_replicas": [
                [tensor(json!([0.699999988079071, 1.5]))],
                [tensor(json!([0.699999988079071, 1.5]))]
            ]
        }),
        "{who}"
    );
}

/// Which `--backend` values to try: `gpu` only where an adapter exists (or the tests must
/// fail without one, as everywhere else, unless DISTOPT_ALLOW_NO_GPU=1).
fn backends() -> Vec<&'static str> {
    let mut out = vec!["cpu", "auto"];
    if common::gpu_backend().is_some() {
        out.push("gpu");
    }
    out
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn step_reads_stdin_on_every_backend() {
    for backend in backends() {
        let result = step_ok(&["step", "--backend", backend], Some(EXAMPLE_1));
        check_example_1(&result, backend);
        // `-` names stdin explicitly, and options may come after it.
        let result = step_ok(&["step", "-", "--backend", backend], Some(EXAMPLE_1));
        check_example_1(&result, backend);
    }
    // No --backend: auto.
    check_example_1(&step_ok(&["step"], Some(EXAMPLE_1)), "default");
}

#[test]
fn step_reads_a_file_argument() {
    let path = temp_file("example1.json", EXAMPLE_1);
    let file = path.to_str().unwrap();
    for backend in backends() {
        // stdin is ignored when a file is given (it is closed empty here).
        let result = step_ok(&["step", file, "--backend", backend], None);
        check_example_1(&result, backend);
        let result = step_ok(&["step", "--backend", backend, file], None);
        check_example_1(&result, backend);
    }
    std::fs::remove_file(path).ok();
}

#[test]
fn step_prints_golden_format_tensors_with_non_finite_values() {
    let request = json!({
        "parameter_replicas": [
            [{"dtype": "float16", "shape": [3], "data": [1.0, 2.0, 65504.0]}, {"dtype": "bfloat16", "shape": [], "data": [2.0]}],
            [{"dtype": "float16", "shape": [3], "data": [1.0, 2.0, 65504.0]}, {"dtype": "bfloat16", "shape": [], "data": [2.0]}]
        ],
        "gradient_replicas": [
            [{"dtype": "float32", "shape": [3], "data": ["nan", "inf", 70000.0]}, null],
            [{"dtype": "float64", "shape": [3], "data": [1.0, 1.0, 70000.0]}, {"dtype": "float32", "shape": [], "data": [-0.0]}]
        ],
        "learning_rate": -1.0
    });
    for backend in backends() {
        let result = step_ok(&["step", "--backend", backend], Some(&request.to_string()));
        assert_eq!(
            result["mean_gradients"],
            json!([
                {"dtype": "float16", "shape": [3], "data": ["nan", "inf", "inf"]},
                {"dtype": "bfloat16", "shape": [], "data": [0.0]}
            ]),
            "{backend}"
        );
        for rank in 0..2 {
            assert_eq!(
                result["updated_replicas"][rank],
                json!([
                    {"dtype": "float16", "shape": [3], "data": ["nan", "inf", "inf"]},
                    {"dtype": "bfloat16", "shape": [], "data": [2.0]}
                ]),
                "{backend}"
            );
        }
    }
}

/// Exits non-zero, prints nothing on stdout and a `distopt: ...` message on stderr that
/// contains every needle.
fn assert_fails(args: &[&str], stdin: Option<&str>, needles: &[&str]) {
    let out = distopt(args, stdin);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        !out.status.success(),
        "distopt {args:?} succeeded: {stdout}"
    );
    assert!(
        stdout.is_empty(),
        "distopt {args:?} printed on stdout: {stdout}"
    );
    assert!(
        stderr.starts_with("distopt: "),
        "distopt {args:?}: stderr {stderr:?}"
    );
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "distopt {args:?}: stderr {stderr:?} lacks {needle:?}"
        );
    }
}

#[test]
fn bad_input_fails_with_a_message_on_stderr() {
    let step = ["step", "--backend", "cpu"];
    assert_fails(&step, Some("{not json"), &["invalid JSON"]);
    assert_fails(&step, Some(""), &["invalid JSON"]);
    assert_fails(&step, Some("[1, 2]"), &["ValueError", "object"]);
    assert_fails(
        &step,
        Some(
            r#"{"parameter_replicas": [[[1,2]],[[1,2,3]]], "gradient_replicas": [[null],[null]], "learning_rate": 0.1}"#,
        ),
        &[
            "ValueError",
            "parameter shape mismatch",
            "rank 1",
            "[3]",
            "[2]",
        ],
    );
    assert_fails(
        &step,
        Some(
            r#"{"parameter_replicas": [[[1,2]]], "gradient_replicas": [[[[1],[2]]]], "learning_rate": 0.1}"#,
        ),
        &["gradient shape mismatch"],
    );
    assert_fails(
        &step,
        Some(
            r#"{"parameter_replicas": [[[[1,2],[3]]]], "gradient_replicas": [[null]], "learning_rate": 0.1}"#,
        ),
        &["ragged"],
    );
    assert_fails(
        &step,
        Some(
            r#"{"parameter_replicas": [[{"dtype": "int64", "shape": [1], "data": [1]}]], "gradient_replicas": [[null]], "learning_rate": 0.1}"#,
        ),
        &["unsupported dtype"],
    );
    assert_fails(
        &step,
        Some(r#"{"parameter_replicas": [], "gradient_replicas": [], "learning_rate": 0.1}"#),
        &["no replicas"],
    );
    // The GPU backend validates the same way (the request is rejected before any backend
    // runs, so this does not need an adapter).
    assert_fails(
        &["step", "--backend", "gpu"],
        Some(r#"{"parameter_replicas": [[[1]]], "gradient_replicas": [], "learning_rate": 0.1}"#),
        &["gradient replica count mismatch"],
    );
    // Command-line mistakes.
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-request.json");
    assert_fails(&["step", missing.to_str().unwrap()], None, &["cannot read"]);
    assert_fails(
        &["step", "--backend", "tpu"],
        Some(EXAMPLE_1),
        &["unknown backend"],
    );
    assert_fails(&["step", "--backend"], Some(EXAMPLE_1), &["--backend"]);
    assert_fails(
        &["step", "--fast"],
        Some(EXAMPLE_1),
        &["usage error", "unexpected argument '--fast'"],
    );
    assert_fails(&[], None, &["needs a command: step, info, bench, train"]);
    assert_fails(
        &["frobnicate"],
        None,
        &["unrecognized subcommand 'frobnicate'"],
    );
}

/// `distopt ARGS` is a usage error: exit status 2, nothing on stdout, one line naming the
/// mistake (containing every needle) and one hint naming the command's help.
fn assert_usage_error(args: &[&str], needles: &[&str], help: &str) {
    let out = distopt(args, Some(EXAMPLE_1));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "distopt {args:?}: {stderr}");
    assert!(stdout.is_empty(), "distopt {args:?} printed {stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "distopt {args:?}: {stderr}");
    assert!(
        lines[0].starts_with("distopt: usage error: "),
        "distopt {args:?}: {stderr}"
    );
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "{args:?}: {stderr} lacks {needle:?}"
        );
    }
    assert!(
        lines[1].contains(&format!("see '{help} --help'")),
        "{args:?}: {stderr}"
    );
}

#[test]
fn usage_errors_exit_2_with_one_line_and_a_hint() {
    // A flag given twice (this printed 40 lines of usage before).
    assert_usage_error(
        &["step", "--backend", "cpu", "--backend", "gpu"],
        &["'--backend <auto|gpu|cpu>' cannot be used multiple times"],
        "distopt step",
    );
    // Extra positional arguments are refused, not ignored.
    assert_usage_error(
        &["step", "a.json", "b.json"],
        &["unexpected argument 'b.json'"],
        "distopt step",
    );
    assert_usage_error(
        &["info", "extra"],
        &["unexpected argument 'extra'"],
        "distopt info",
    );
    // Malformed values, missing values, unknown flags and subcommands.
    assert_usage_error(
        &["bench", "step", "--repeats", "1e9"],
        &["invalid value '1e9' for '--repeats <K>'", "2^22"],
        "distopt bench step",
    );
    assert_usage_error(
        &["bench", "step", "--repeats", "1000000000"],
        &["at most 1000000 repetitions"],
        "distopt bench step",
    );
    assert_usage_error(
        &["bench", "average", "--params", "1,x"],
        &["invalid value 'x' for '--params <P1,P2,…>'"],
        "distopt bench average",
    );
    assert_usage_error(
        &["train", "--ranks"],
        &["a value is required for '--ranks <R>'"],
        "distopt train",
    );
    assert_usage_error(
        &["train", "--task", "imagenet"],
        &["invalid value 'imagenet' for '--task <TASK>'"],
        "distopt train",
    );
    assert_usage_error(
        &["bench"],
        &["'distopt bench' needs a command: step, average, optim, zero, all, comm"],
        "distopt bench",
    );
    assert_usage_error(
        &["bench", "sprint"],
        &["unrecognized subcommand 'sprint'"],
        "distopt bench",
    );
    // --opt=value is the same as --opt value.
    check_example_1(
        &step_ok(&["step", "--backend=cpu"], Some(EXAMPLE_1)),
        "--backend=cpu",
    );
}

#[test]
fn every_command_has_help_and_the_tool_a_version() {
    for command in [
        &[][..],
        &["step"],
        &["info"],
        &["bench"],
        &["bench", "step"],
        &["bench", "average"],
        &["bench", "optim"],
        &["bench", "zero"],
        &["bench", "all"],
        &["bench", "comm"],
        &["train"],
    ] {
        let mut args = command.to_vec();
        args.push("--help");
        let out = distopt(&args, None);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let usage = format!(
            "Usage: {}",
            ["distopt"]
                .iter()
                .chain(command)
                .copied()
                .collect::<Vec<_>>()
                .join(" ")
        );
        assert!(
            stdout.contains(&usage),
            "{args:?} lacks {usage:?}: {stdout}"
        );
        assert!(stdout.contains("--help"), "{args:?}: {stdout}");
    }
    // Each command's own flags are in its help.
    let help = |args: &[&str]| text(&distopt(args, None).stdout);
    assert!(help(&["train", "--help"]).contains("--task <TASK>"));
    assert!(help(&["train", "--help"]).contains("synthetic"));
    assert!(help(&["bench", "zero", "--help"]).contains("--worlds <W1,W2,…>"));
    assert!(help(&["step", "--help"]).contains("[FILE]"));
    let out = distopt(&["--version"], None);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("distopt {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn info_json_is_one_object() {
    let out = distopt(&["info", "--json"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let info: Value = serde_json::from_str(&text(&out.stdout)).expect("info --json prints JSON");
    let kind = info["auto"]["kind"].as_str().unwrap();
    assert!(kind == "cpu" || kind == "gpu", "{info}");
    assert!(
        !info["auto"]["reason"].as_str().unwrap().is_empty(),
        "{info}"
    );
    assert!(
        info["memory_budget"]["bytes"].as_u64().unwrap() > 0,
        "{info}"
    );
    assert_eq!(info["version"], env!("CARGO_PKG_VERSION"));
    if let Some(gpu) = common::gpu_backend() {
        assert_eq!(
            info["gpu_adapter"]["name"],
            gpu.info().name.as_str(),
            "{info}"
        );
        assert_eq!(info["gpu_error"], Value::Null);
    } else {
        assert_eq!(info["gpu_adapter"], Value::Null);
        assert!(info["gpu_error"].is_string());
    }
}

/// Runs `distopt args` (`stdin` on its standard input) with its standard output going to
/// `stdout`, and returns its status and stderr.
fn distopt_into(args: &[&str], stdin: &str, stdout: Stdio) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_distopt"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("the distopt binary runs");
    let mut pipe = child.stdin.take().unwrap();
    match pipe.write_all(stdin.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("stdin: {e}"),
        _ => drop(pipe),
    }
    let out = child.wait_with_output().unwrap();
    (out.status, text(&out.stderr))
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_and_a_failed_write_is_an_error() {
    let commands: [&[&str]; 3] = [
        &["step", "--backend", "cpu"],
        &["info"],
        &[
            "train",
            "--backend",
            "cpu",
            "--steps",
            "4",
            "--ranks",
            "2",
            "--json",
        ],
    ];
    for args in commands {
        // `distopt … | head -c 0`: the reader is gone before anything is written.
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let (status, stderr) = distopt_into(args, EXAMPLE_1, writer.into());
        assert!(
            // (Mesa may say things on stderr; distopt itself must say nothing.)
            status.success() && !stderr.contains("panicked") && !stderr.contains("distopt:"),
            "distopt {args:?} into a closed pipe: {status}, stderr {stderr:?}"
        );
        // A full disk: the write fails, and says so.
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            continue;
        };
        let (status, stderr) = distopt_into(args, EXAMPLE_1, full.into());
        assert_eq!(
            status.code(),
            Some(1),
            "distopt {args:?} into /dev/full: {stderr}"
        );
        assert!(
            stderr.contains("distopt: cannot write to standard output: No space left on device")
                && !stderr.contains("panicked"),
            "distopt {args:?} into /dev/full: {stderr:?}"
        );
    }
}

#[test]
fn train_finishes_at_the_step_told_on_stdin() {
    let train = |stdin: &str| {
        distopt(
            &[
                "train",
                "--algorithm",
                "diloco",
                "--ranks",
                "2",
                "--backend",
                "cpu",
                "--steps",
                "1000000000",
                "--finish-on-stdin",
                "--json",
            ],
            Some(stdin),
        )
    };
    let out = train("not a command\nfinish 300\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&text(&out.stdout)).expect("a JSON report");
    assert_eq!(report["steps"], 300, "{report}");
    assert_eq!(
        report["results"][0]["mean_loss_per_step"]
            .as_array()
            .map(Vec::len),
        Some(300)
    );
    let progress: Vec<&str> = std::str::from_utf8(&out.stderr)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("progress "))
        .collect();
    assert_eq!(progress.first(), Some(&"progress 0"));
    assert_eq!(progress.last(), Some(&"progress 300"));
    assert_eq!(progress.len(), 7, "every 50 steps: {progress:?}");
    // Standard input closed without a `finish` line: the run ends where it is.
    let out = train("");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&text(&out.stdout)).expect("a JSON report");
    assert!(
        report["steps"].as_u64().is_some_and(|s| s < 1000),
        "{report}"
    );
    assert_fails(
        &["train", "--finish-on-stdin", "--backend", "cpu"],
        None,
        &["--finish-on-stdin ends one algorithm's run: give --algorithm"],
    );
}

/// `distopt ARGS` with `DISTOPT_MEMORY_BUDGET=budget` (or the default budget).
fn distopt_with_budget(args: &[&str], budget: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distopt"));
    command.args(args);
    match budget {
        Some(b) => command.env("DISTOPT_MEMORY_BUDGET", b),
        None => command.env_remove("DISTOPT_MEMORY_BUDGET"),
    };
    command.output().unwrap()
}

#[test]
fn benchmarks_refuse_sizes_beyond_the_memory_budget() {
    // Each is refused before it allocates: a RuntimeError naming the request and the budget,
    // exit 1, no abort (134) and no machine swapping.
    let cases: [(&[&str], &str, &str); 5] = [
        (
            &["bench", "average", "--elements", "2^20", "--backend", "cpu"],
            "bench average with R = 8, N = 1048576, P = 1",
            "1.00 MiB memory budget",
        ),
        (
            &[
                "bench",
                "optim",
                "--ranks",
                "2",
                "--elements",
                "2^20",
                "--backend",
                "cpu",
            ],
            "bench optim with R = 2, N = 1048576",
            "1.00 MiB memory budget",
        ),
        (
            &[
                "bench",
                "zero",
                "--worlds",
                "1,64",
                "--elements",
                "2^20",
                "--backend",
                "cpu",
            ],
            "bench zero with R = 64",
            "1.00 MiB memory budget",
        ),
        (
            &["bench", "step", "--elements", "2^20", "--backend", "cpu"],
            "bench step with R = 4, N = 1048576",
            "1.00 MiB memory budget",
        ),
        (
            &[
                "train",
                "--steps",
                "1",
                "--backend",
                "cpu",
                "--algorithm",
                "sync",
                "--ranks",
                "64",
            ],
            "not enough memory",
            "1.00 MiB memory budget",
        ),
    ];
    for (args, what, budget) in cases {
        let out = distopt_with_budget(args, Some("1MiB"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("distopt: RuntimeError: not enough memory for "),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(what), "{args:?}: {stderr} lacks {what:?}");
        assert!(
            stderr.contains(budget),
            "{args:?}: {stderr} lacks {budget:?}"
        );
        assert!(
            stderr.contains("DISTOPT_MEMORY_BUDGET"),
            "{args:?}: {stderr}"
        );
    }
    // With the default budget (a fraction of physical memory), absurd sizes are refused the
    // same way: this one grew to 18 GB before.
    for args in [
        &[
            "bench",
            "average",
            "--params",
            "100000000",
            "--backend",
            "cpu",
        ][..],
        &["bench", "average", "--elements", "2^40", "--backend", "cpu"],
        &["bench", "optim", "--ranks", "100000000", "--backend", "cpu"],
        &[
            "bench",
            "zero",
            "--worlds",
            "1,100000000",
            "--backend",
            "cpu",
        ],
        &["bench", "step", "--elements", "2^50", "--backend", "cpu"],
    ] {
        let out = distopt_with_budget(args, None);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("RuntimeError: not enough memory for bench"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("memory budget"), "{args:?}: {stderr}");
    }
    // An invalid budget is an error, not silently ignored.
    let out = distopt_with_budget(&["info"], Some("lots"));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("DISTOPT_MEMORY_BUDGET: invalid memory budget \"lots\""));
    // A budget that fits runs.
    let out = distopt_with_budget(
        &[
            "bench",
            "average",
            "--elements",
            "2^12",
            "--params",
            "1",
            "--repeats",
            "1",
            "--backend",
            "cpu",
            "--json",
        ],
        Some("64MiB"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(report["bench"], "average", "{report}");
}

#[test]
fn info_names_the_adapter_and_the_backend_choice() {
    let out = distopt(&["info"], None);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "distopt info failed: {}",
        text(&out.stderr)
    );
    assert!(stdout.contains("GPU adapter:"), "{stdout}");
    assert!(stdout.contains("--backend auto picks:"), "{stdout}");
    assert!(stdout.contains("because"), "{stdout}");
    if let Some(gpu) = common::gpu_backend() {
        let info = gpu.info();
        assert!(
            stdout.contains(&info.name),
            "{stdout} lacks the adapter {}",
            info.name
        );
        assert!(
            stdout.contains(&info.api),
            "{stdout} lacks the API {}",
            info.api
        );
    }
}

#[test]
fn help_prints_usage() {
    let out = distopt(&["--help"], None);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.contains("distopt step"), "{stdout}");
    assert!(stdout.contains("distopt info"), "{stdout}");
}

#[test]
fn train_learns_the_digits_and_reports_held_out_accuracy() {
    let out = distopt(
        &[
            "train",
            "--task",
            "digits",
            "--steps",
            "150",
            "--ranks",
            "4",
            "--backend",
            "cpu",
            "--algorithm",
            "all",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["task"]["name"], "digits");
    // 1,797 digits: a held-out fifth, the rest over the 4 ranks.
    let shards: u64 = report["task"]["samples_per_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(shards, 1438);
    let results = report["results"].as_array().unwrap();
    assert_eq!(
        results.len(),
        5,
        "sync, periodic, hierarchical, zero, diloco"
    );
    for r in results {
        let accuracy = r["mean_model_accuracy"].as_f64().unwrap();
        // Chance is 10%; every algorithm reaches above 85% held out in 150 steps.
        assert!(accuracy > 0.85, "{}: {accuracy}", r["algorithm"]);
    }
    // --samples belongs to the synthetic task.
    let refused = distopt(&["train", "--task", "digits", "--samples", "100"], None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("--samples"),
        "{}",
        text(&refused.stderr)
    );
}
