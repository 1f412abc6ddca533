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
    assert_fails(&["step", "--fast"], Some(EXAMPLE_1), &["unknown option"]);
    assert_fails(&[], None, &["expected a command"]);
    assert_fails(&["frobnicate"], None, &["expected a command"]);
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
