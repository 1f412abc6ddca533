//! The golden runner: every case in `tests/golden/`, in `tests/torch-cases/` (the project's own
//! cases, made by real PyTorch with `scripts/torch-cases.py`), in `tests/torchft-cases/` (made by
//! torchft's own `DiLoCo` with `scripts/torchft-cases.py`) and in `$DISTOPT_GOLDEN_DIR` when set,
//! on the CPU backend and on the GPU backend, compared with PyTorch's outputs. Prints one line
//! per kind and backend. Nothing is dropped silently: a file that is not a valid case (its
//! `name` not its file name, say), a kind without a runner, or fewer cases run per kind and
//! backend than there are files of that kind on disk fails the run.

mod common;
mod runners;

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;

use common::{
    Case, compare_error, compare_tensor, files_per_kind, golden_dirs, gpu_backend, load_golden,
};
use distopt::BlockOn;
use distopt::step::step_request_from_json;
use distopt::{Backend, CpuBackend, sgd_step};

enum Outcome {
    Passed { bit_exact: bool },
    Failed(String),
}

fn run_dp_sgd_step(backend: &dyn Backend, case: &Case) -> Result<bool, String> {
    let result = step_request_from_json(case.input()).and_then(|request| {
        sgd_step(
            backend,
            &request.parameter_replicas,
            &request.gradient_replicas,
            request.learning_rate,
        )
        .block_on()
    });
    let expected = case.expected();
    if expected.get("error").is_some() {
        return match result {
            Ok(_) => Err("expected an error, the step succeeded".into()),
            Err(err) => compare_error(case, &err).map(|()| true),
        };
    }
    let output = result.map_err(|e| format!("unexpected error: {e}"))?;
    let mut exact = true;
    let means = expected["mean_gradients"]
        .as_array()
        .ok_or("expected.mean_gradients")?;
    if means.len() != output.mean_gradients.len() {
        return Err(format!(
            "{} mean gradients, expected {}",
            output.mean_gradients.len(),
            means.len()
        ));
    }
    for (j, (actual, want)) in output.mean_gradients.iter().zip(means).enumerate() {
        exact &= compare_tensor(case, actual, want, &format!("mean_gradients[{j}]"))?.bit_exact;
    }
    let replicas = expected["updated_replicas"]
        .as_array()
        .ok_or("expected.updated_replicas")?;
    if replicas.len() != output.updated_replicas.len() {
        return Err(format!(
            "{} replicas, expected {}",
            output.updated_replicas.len(),
            replicas.len()
        ));
    }
    for (r, (actual, want)) in output.updated_replicas.iter().zip(replicas).enumerate() {
        let want = want.as_array().ok_or("expected.updated_replicas[r]")?;
        if want.len() != actual.len() {
            return Err(format!(
                "rank {r}: {} parameters, expected {}",
                actual.len(),
                want.len()
            ));
        }
        for (j, (a, w)) in actual.iter().zip(want).enumerate() {
            exact &= compare_tensor(case, a, w, &format!("updated_replicas[{r}][{j}]"))?.bit_exact;
        }
    }
    Ok(exact)
}

fn run_case(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let result = match case.kind.as_str() {
        "dp_sgd_step" => run_dp_sgd_step(backend.as_ref(), case),
        "local_optimizer" => runners::optimizers::run(backend, case),
        "periodic_averager" | "hierarchical_averager" => {
            runners::averagers::run(backend, case, &runners::simulated_world)
        }
        "post_local_sgd" => runners::post_local_sgd::run(backend, case, &runners::simulated_world),
        "distributed_optimizer" => runners::distributed_optimizer::run(backend, case),
        "diloco" => runners::diloco::run(backend, case, &runners::simulated_world),
        "streaming_diloco" => {
            runners::streaming_diloco::run(backend, case, &runners::simulated_world)
        }
        "zero_partition" | "zero_trajectory" | "zero_errors" | "zero_join" => {
            runners::zero::run(backend, case)
        }
        other => Err(format!(
            "unknown kind {other:?}: no runner checks it (add one in tests/runners/)"
        )),
    };
    // The simulated world holds every world size: no part of a case may be left out here.
    let skipped = runners::take_skipped_parts();
    match result {
        Ok(_) if !skipped.is_empty() => Outcome::Failed(format!(
            "parts not run on the simulated world: {}",
            skipped.join("; ")
        )),
        Ok(bit_exact) => Outcome::Passed { bit_exact },
        Err(message) => Outcome::Failed(message),
    }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    bit_exact: usize,
}

fn main() -> ExitCode {
    let golden = load_golden();
    // Counted from the folders apart from the loader, so that a case the loader or the loop
    // drops shows as a count mismatch.
    let files = files_per_kind();
    let mut failures: Vec<String> = golden
        .problems
        .iter()
        .map(|p| format!("invalid case file {p}"))
        .collect();
    let mut backends: Vec<(&str, Arc<dyn Backend>)> = vec![("cpu", Arc::new(CpuBackend::new()))];
    if let Some(gpu) = gpu_backend() {
        println!(
            "GPU adapter: {} ({}, {})",
            gpu.info().name,
            gpu.info().api,
            gpu.info().device_type
        );
        backends.push(("gpu", gpu));
    }
    let mut tallies: BTreeMap<(String, &str), Tally> = BTreeMap::new();
    for (label, backend) in &backends {
        for case in &golden.cases {
            let tally = tallies.entry((case.kind.clone(), label)).or_default();
            match run_case(backend, case) {
                Outcome::Passed { bit_exact } => {
                    tally.passed += 1;
                    tally.bit_exact += usize::from(bit_exact);
                    if !bit_exact && std::env::var_os("DISTOPT_GOLDEN_VERBOSE").is_some() {
                        println!("{label} {}: within tolerance, not bit-exact", case.name);
                    }
                }
                Outcome::Failed(message) => {
                    tally.failed += 1;
                    failures.push(format!(
                        "{label} {} ({}): {message}",
                        case.name,
                        case.path.display()
                    ));
                }
            }
        }
    }
    // Every kind on disk, on every backend: as many cases ran as there are files.
    let mut total = Tally::default();
    let kinds: BTreeSet<String> = files
        .keys()
        .chain(tallies.keys().map(|(k, _)| k))
        .cloned()
        .collect();
    for kind in &kinds {
        let on_disk = files.get(kind).copied().unwrap_or(0);
        for (label, _) in &backends {
            let t = tallies.remove(&(kind.clone(), label)).unwrap_or_default();
            println!(
                "{kind} {label}: {} passed, {} failed ({} bit-exact) of {on_disk} files",
                t.passed, t.failed, t.bit_exact
            );
            if t.passed + t.failed != on_disk {
                failures.push(format!(
                    "{kind} {label}: {} cases ran, {on_disk} files on disk",
                    t.passed + t.failed
                ));
            }
            total.passed += t.passed;
            total.failed += t.failed;
        }
    }
    for failure in &failures {
        println!("FAILED {failure}");
    }
    let on_disk: usize = files.values().sum();
    println!(
        "golden: {} passed, {} failed; {on_disk} files of {} kinds on {} backends ({})",
        total.passed,
        total.failed,
        kinds.len(),
        backends.len(),
        golden_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
