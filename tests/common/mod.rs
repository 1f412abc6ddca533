//! Shared by the golden runner and the property tests: reading cases and comparing results
//! with PyTorch's by the rules of the golden README (section 15).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use distopt::json::tensor_from_json;
use distopt::{Backend, DType, Error, GpuBackend, Tensor};
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

/// Every `*.json` case in `tests/golden/` and in `$DISTOPT_GOLDEN_DIR` (when set), each case
/// name once (the project's copy first).
pub fn load_cases() -> Vec<Case> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")];
    if let Some(extra) = std::env::var_os("DISTOPT_GOLDEN_DIR") {
        dirs.push(PathBuf::from(extra));
    }
    let mut cases: Vec<Case> = Vec::new();
    for dir in dirs {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read golden folder {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).expect("readable case");
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: invalid JSON: {e}", path.display()));
            let name = value["name"].as_str().unwrap_or_default().to_string();
            if cases.iter().any(|c| c.name == name) {
                continue;
            }
            let kind = value["kind"].as_str().unwrap_or_default().to_string();
            cases.push(Case {
                path,
                name,
                kind,
                value,
            });
        }
    }
    cases
}

/// Outcome of comparing one value.
#[derive(Default)]
pub struct Comparison {
    /// Every element had the expected bits (NaN payloads aside).
    pub bit_exact: bool,
}

/// Compares `actual` with the expected tensor JSON under the case's tolerance.
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
        .to_host_blocking()
        .map_err(|e| format!("{what}: {e}"))?;
    let (a, e) = (actual.values_f64().unwrap(), expected.values_f64().unwrap());
    let (rtol, atol) = case.tolerance(actual.dtype());
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
    match GpuBackend::new_blocking() {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(err) if std::env::var("DISTOPT_ALLOW_NO_GPU").as_deref() == Ok("1") => {
            eprintln!("no GPU adapter ({err}); GPU tests skipped because DISTOPT_ALLOW_NO_GPU=1");
            None
        }
        Err(err) => panic!("no GPU adapter: {err} (set DISTOPT_ALLOW_NO_GPU=1 to skip GPU tests)"),
    }
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
