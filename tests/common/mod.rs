//! Shared by the golden runner and the property tests: reading cases and comparing results
//! with PyTorch's by the rules of the golden README (section 15).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use distopt::BlockOn;
use distopt::json::tensor_from_json;
use distopt::{Backend, CpuBackend, DType, Error, GpuBackend, Tensor};
use serde_json::Value;

/// One golden case file.
pub struct Case {
    pub path: PathBuf,
    pub name: String,
    pub kind: String,
    pub value: Value,
}

impl Case {
    pub fn input(&self) -> &Value {
        &self.value["input"]
    }
    pub fn expected(&self) -> &Value {
        &self.value["expected"]
    }
    /// `(rtol, atol)` of the case for `dtype`.
    pub fn tolerance(&self, dtype: DType) -> (f64, f64) {
        let entry = &self.value["tolerance"][dtype.name()];
        (
            entry["rtol"].as_f64().unwrap_or(0.0),
            entry["atol"].as_f64().unwrap_or(0.0),
        )
    }
}

/// The folders the golden cases are read from: `tests/golden/` of the repository (the one
/// this test was built in, or `$DISTOPT_GOLDEN_ROOT` when set: a copy of the repository on
/// another machine, as `scripts/gpu-report.sh` runs it), then `$DISTOPT_GOLDEN_DIR` when set.
pub fn golden_dirs() -> Vec<PathBuf> {
    let root = std::env::var_os("DISTOPT_GOLDEN_ROOT")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    // The shared cases, then the project's own PyTorch-produced ones (`scripts/torch-cases.py`)
    // and torchft-produced ones (`scripts/torchft-cases.py`).
    let mut dirs = vec![
        root.join("tests/golden"),
        root.join("tests/torch-cases"),
        root.join("tests/torchft-cases"),
    ];
    if let Some(extra) = std::env::var_os("DISTOPT_GOLDEN_DIR") {
        dirs.push(PathBuf::from(extra));
    }
    dirs
}

/// Every `*.json` file of a folder, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read golden folder {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
}

/// The golden cases found on disk, and everything wrong with the files (a case that cannot
/// be read is a problem, never a silent omission).
pub struct Golden {
    /// One case per distinct name (the project's copy first).
    pub cases: Vec<Case>,
    /// Files that are not valid cases: unreadable, invalid JSON, no `kind`/`name`, a `name`
    /// other than the file name, or a second file of an existing name with other content.
    pub problems: Vec<String>,
}

/// Reads every `*.json` case in [`golden_dirs`]. A file whose name was already read from an
/// earlier folder must hold the same case (a copy) and is read once.
pub fn load_golden() -> Golden {
    let mut cases: Vec<Case> = Vec::new();
    let mut problems = Vec::new();
    for dir in golden_dirs() {
        for path in json_files(&dir) {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    problems.push(format!("{}: not a readable JSON case: {e}", path.display()));
                    continue;
                }
            };
            let case = match parse_case(&path, &text) {
                Ok(case) => case,
                Err(problem) => {
                    problems.push(problem);
                    continue;
                }
            };
            if let Some(first) = cases.iter().find(|c| c.name == case.name) {
                if first.value != case.value {
                    problems.push(format!(
                        "{}: differs from {}, the case of the same name read first",
                        path.display(),
                        first.path.display()
                    ));
                }
                continue;
            }
            cases.push(case);
        }
    }
    Golden { cases, problems }
}

/// Reads one case file's text (`path` names it in messages and gives the file name its
/// `name` must equal): the case, or what is wrong with it.
pub fn parse_case(path: &Path, text: &str) -> Result<Case, String> {
    let shown = path.display();
    let value: Value = serde_json::from_str(text)
        .map_err(|e| format!("{shown}: not a readable JSON case: {e}"))?;
    let (Some(name), Some(kind)) = (value["name"].as_str(), value["kind"].as_str()) else {
        return Err(format!("{shown}: no \"name\" or \"kind\" string"));
    };
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if name != stem {
        return Err(format!(
            "{shown}: its name {name:?} is not its file name {stem:?} (README section 2: the file name is `name` + `.json`)"
        ));
    }
    Ok(Case {
        path: path.to_path_buf(),
        name: name.to_string(),
        kind: kind.to_string(),
        value,
    })
}

/// Every golden case, as [`load_golden`] reads them; panics listing the files that are not
/// valid cases.
pub fn load_cases() -> Vec<Case> {
    let golden = load_golden();
    if !golden.problems.is_empty() {
        panic!("invalid golden files:\n{}", golden.problems.join("\n"));
    }
    golden.cases
}

/// What is on disk, counted apart from [`load_golden`]: per `kind` field, the number of
/// distinct case files (a file name in several folders counts once). Files without a
/// readable `kind` count under `"<unreadable>"`.
pub fn files_per_kind() -> BTreeMap<String, usize> {
    let mut seen = BTreeSet::new();
    let mut counts = BTreeMap::new();
    for dir in golden_dirs() {
        for path in json_files(&dir) {
            if !seen.insert(path.file_name().map(|n| n.to_owned())) {
                continue;
            }
            let kind = std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                .and_then(|v| v["kind"].as_str().map(str::to_string))
                .unwrap_or_else(|| "<unreadable>".to_string());
            *counts.entry(kind).or_default() += 1;
        }
    }
    counts
}

/// Outcome of comparing one value.
#[derive(Default)]
pub struct Comparison {
    /// Every element had the expected bits (NaN payloads aside).
    pub bit_exact: bool,
}

/// Compares `actual` with the expected tensor JSON under the case's tolerance (README
/// section 15; in `dp_sgd_step` a zero must also match in sign).
pub fn compare_tensor(
    case: &Case,
    actual: &Tensor,
    expected: &Value,
    what: &str,
) -> Result<Comparison, String> {
    let expected = tensor_from_json(expected, what)
        .map_err(|e| format!("{what}: bad expected tensor: {e}"))?;
    if actual.dtype() != expected.dtype() {
        return Err(format!(
            "{what}: dtype {} != expected {}",
            actual.dtype(),
            expected.dtype()
        ));
    }
    if actual.shape() != expected.shape() {
        return Err(format!(
            "{what}: shape {:?} != expected {:?}",
            actual.shape(),
            expected.shape()
        ));
    }
    let actual = actual
        .to_host()
        .block_on()
        .map_err(|e| format!("{what}: {e}"))?;
    let (a, e) = (actual.values_f64().unwrap(), expected.values_f64().unwrap());
    let (rtol, atol) = case.tolerance(actual.dtype());
    let signed_zeros = case.kind == "dp_sgd_step";
    let mut bit_exact = true;
    for (i, (&a, &e)) in a.iter().zip(&e).enumerate() {
        let ok = if e.is_nan() {
            a.is_nan()
        } else if e.is_infinite() {
            a == e
        } else {
            a.is_finite() && (a - e).abs() <= atol + rtol * e.abs()
        };
        if !ok {
            return Err(format!(
                "{what}[{i}]: got {a:e}, expected {e:e} (rtol {rtol}, atol {atol})"
            ));
        }
        // README section 15: dp_sgd_step's arithmetic is fully specified, so a zero must
        // match in sign too (-0.0 is not 0.0). Elsewhere the tolerance rule alone applies.
        if signed_zeros && e == 0.0 && a == 0.0 && a.is_sign_negative() != e.is_sign_negative() {
            return Err(format!(
                "{what}[{i}]: got {a:?}, expected {e:?} (in {} a zero must match in sign)",
                case.kind
            ));
        }
        if !(a.is_nan() && e.is_nan()) && a.to_bits() != e.to_bits() {
            if bit_exact && std::env::var_os("DISTOPT_GOLDEN_VERBOSE").is_some() {
                println!("  {what}[{i}]: got {a:e}, expected {e:e}");
            }
            bit_exact = false;
        }
    }
    Ok(Comparison { bit_exact })
}

/// Checks an error against `expected.error` (type and message substring).
pub fn compare_error(case: &Case, error: &Error) -> Result<(), String> {
    let spec = &case.expected()["error"];
    let kind = spec["type"].as_str().unwrap_or_default();
    let needle = spec["message_contains"].as_str().unwrap_or_default();
    if error.kind().name() != kind {
        return Err(format!(
            "error type {} != expected {kind} ({error})",
            error.kind().name()
        ));
    }
    if !error.message().contains(needle) {
        return Err(format!(
            "error message {:?} lacks {needle:?}",
            error.message()
        ));
    }
    Ok(())
}

/// The GPU backend, or `None` when there is no adapter and `DISTOPT_ALLOW_NO_GPU=1`.
/// Without that variable a missing adapter is a failure: the GPU tests must really run.
pub fn gpu_backend() -> Option<Arc<dyn Backend>> {
    match GpuBackend::new().block_on() {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(err) if std::env::var("DISTOPT_ALLOW_NO_GPU").as_deref() == Ok("1") => {
            eprintln!("no GPU adapter ({err}); GPU tests skipped because DISTOPT_ALLOW_NO_GPU=1");
            None
        }
        Err(err) => panic!("no GPU adapter: {err} (set DISTOPT_ALLOW_NO_GPU=1 to skip GPU tests)"),
    }
}

/// One GPU backend per test binary, opened on first use ([`gpu_backend`]'s rules).
pub fn shared_gpu() -> Option<Arc<dyn Backend>> {
    static GPU: OnceLock<Option<Arc<dyn Backend>>> = OnceLock::new();
    GPU.get_or_init(gpu_backend).clone()
}

/// One GPU backend per test binary with 4 KiB storage bindings and one workgroup per
/// dimension: every arena of more than a few hundred elements is chunked, and the chunks'
/// dispatches spill into y.
pub fn tiny_gpu() -> Option<Arc<dyn Backend>> {
    static GPU: OnceLock<Option<Arc<dyn Backend>>> = OnceLock::new();
    GPU.get_or_init(|| {
        gpu_backend_with_options(
            distopt::backend::gpu::GpuOptions::default()
                .with_max_binding_bytes(4096)
                .with_max_workgroups_per_dimension(1),
        )
    })
    .clone()
}

/// `("cpu", CPU backend)`, then `("gpu", [shared_gpu])` where there is one: what a test that
/// must hold on both backends runs over, named for its messages.
pub fn named_backends() -> Vec<(&'static str, Arc<dyn Backend>)> {
    let mut out: Vec<(&'static str, Arc<dyn Backend>)> = vec![("cpu", Arc::new(CpuBackend::new()))];
    if let Some(gpu) = shared_gpu() {
        out.push(("gpu", gpu));
    }
    out
}

/// The CPU backend, then the GPU backend where [`gpu_backend`] gives one: what a test that
/// must hold on both backends runs over.
pub fn backends() -> Vec<Arc<dyn Backend>> {
    let mut all: Vec<Arc<dyn Backend>> = vec![Arc::new(CpuBackend::new())];
    all.extend(gpu_backend());
    all
}

/// A GPU backend opened with `options` (for example tiny bindings that force chunking), or
/// `None` when there is no adapter and `DISTOPT_ALLOW_NO_GPU=1`, like [`gpu_backend`].
pub fn gpu_backend_with_options(
    options: distopt::backend::gpu::GpuOptions,
) -> Option<Arc<dyn Backend>> {
    match pollster::block_on(GpuBackend::with_options(options)) {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(err) if std::env::var("DISTOPT_ALLOW_NO_GPU").as_deref() == Ok("1") => {
            eprintln!("no GPU adapter ({err}); GPU tests skipped because DISTOPT_ALLOW_NO_GPU=1");
            None
        }
        Err(err) => panic!("no GPU adapter: {err} (set DISTOPT_ALLOW_NO_GPU=1 to skip GPU tests)"),
    }
}

/// The `distopt` binary (the command-line crate, `crates/distopt-cli`) of the profile this
/// test was built in: `target/<profile>/distopt`. The library's own tests cannot name it with
/// `CARGO_BIN_EXE_distopt` (that is set only for the binary's own package), so the first
/// call builds it with the cargo that runs the tests (a no-op when it is up to date: `cargo
/// test` at the root builds it already, but `cargo test --test X` does not) and every call
/// returns its path.
pub fn distopt_exe() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        // target/<profile>/deps/<this test> → target/<profile>
        let test = std::env::current_exe().expect("the test's own path");
        let profile_dir = test
            .parent()
            .and_then(Path::parent)
            .expect("a test runs from target/<profile>/deps");
        let target_dir = profile_dir.parent().expect("target/<profile>");
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a profile folder");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .args(["build", "--quiet", "-p", "distopt-cli", "--bin", "distopt"])
            .arg("--target-dir")
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        match profile {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        if cfg!(feature = "mpi") {
            build.args(["--features", "distopt-cli/mpi"]);
        }
        let out = build.output().expect("cargo runs");
        assert!(
            out.status.success(),
            "building the distopt binary failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join(format!("distopt{}", std::env::consts::EXE_SUFFIX))
    })
    .clone()
}

/// Optimizer `name` (`"sgd"`, `"adam"`, …) with `options` (PyTorch's names) over every
/// parameter of `replicas`, as one group.
///
/// # Panics
/// When the options are refused: a test's own setup is wrong.
pub fn optimizer(
    replicas: &distopt::replicas::Replicas,
    name: &str,
    options: Value,
) -> Box<dyn distopt::optim::LocalOptimizer> {
    let options = distopt::optim::option_map(&options).unwrap();
    distopt::optim::create(
        name,
        replicas,
        vec![((0..replicas.len()).collect(), Default::default())],
        &options,
    )
    .unwrap()
}

/// A deterministic pseudo-random stream (the library's splitmix64) of values in [-1, 1).
pub struct Random(distopt::rng::SplitMix64);

impl Random {
    /// The stream from `seed`.
    pub fn new(seed: u64) -> Random {
        Random(distopt::rng::SplitMix64::from_state(seed))
    }

    /// The next value, in [-1, 1).
    pub fn next(&mut self) -> f64 {
        self.0.signed_unit()
    }

    /// A 1-D tensor of `n` such values in `dtype`.
    pub fn tensor(&mut self, dtype: DType, n: usize) -> Tensor {
        let values: Vec<f64> = (0..n).map(|_| self.next()).collect();
        Tensor::from_f64(dtype, &[n], &values).unwrap()
    }
}
