//! Per-kind golden runners, shared helpers for reading case inputs and comparing results.

pub mod averagers;
pub mod diloco;
pub mod distributed_optimizer;
pub mod optimizers;
pub mod post_local_sgd;
pub mod streaming_diloco;
pub mod zero;

use std::collections::BTreeSet;
use std::sync::Arc;

use distopt::comm::{Communicator, SimulatedWorld};
use distopt::json::tensor_from_json;
use distopt::{Error, Tensor};
use serde_json::Value;

use crate::common::{Case, compare_error, compare_tensor};

/// A case's result: `Ok(bit_exact)` or a failure message.
pub type Outcome = Result<bool, String>;

/// Builds the world a multi-rank case runs on, from its world size: the simulated world
/// (every rank in this process), or one rank per process (an `Err` when this process's world
/// cannot have that size). Runners touch only the world's local ranks.
pub type WorldFactory<'a> = &'a dyn Fn(usize) -> Result<Arc<dyn Communicator>, String>;

thread_local! {
    static SKIPPED_PARTS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Records that a part of the running case was not run (with why), for the caller to count
/// and report as skipped: a case with a skipped part never counts as fully passed.
pub fn skip_part(what: String) {
    SKIPPED_PARTS.with(|parts| parts.borrow_mut().push(what));
}

/// The parts recorded by [`skip_part`] since the last call (on this thread).
pub fn take_skipped_parts() -> Vec<String> {
    SKIPPED_PARTS.with(|parts| std::mem::take(&mut *parts.borrow_mut()))
}

/// The simulated world of `size` ranks, all held by this process.
pub fn simulated_world(size: usize) -> Result<Arc<dyn Communicator>, String> {
    SimulatedWorld::new(size)
        .map(|w| Arc::new(w) as Arc<dyn Communicator>)
        .map_err(|e| e.to_string())
}

pub fn tensors(value: &Value, what: &str) -> Result<Vec<Tensor>, String> {
    value
        .as_array()
        .ok_or_else(|| format!("{what}: expected a list"))?
        .iter()
        .enumerate()
        .map(|(j, v)| tensor_from_json(v, &format!("{what}[{j}]")).map_err(|e| e.to_string()))
        .collect()
}

pub fn optional_tensors(value: &Value, what: &str) -> Result<Vec<Option<Tensor>>, String> {
    value
        .as_array()
        .ok_or_else(|| format!("{what}: expected a list"))?
        .iter()
        .enumerate()
        .map(|(j, v)| match v {
            Value::Null => Ok(None),
            v => tensor_from_json(v, &format!("{what}[{j}]"))
                .map(Some)
                .map_err(|e| e.to_string()),
        })
        .collect()
}

pub fn per_rank_tensors(value: &Value, what: &str) -> Result<Vec<Vec<Tensor>>, String> {
    value
        .as_array()
        .ok_or_else(|| format!("{what}: expected a list"))?
        .iter()
        .enumerate()
        .map(|(r, v)| tensors(v, &format!("{what}[{r}]")))
        .collect()
}

/// Compares one rank's tensors with the expected list.
pub fn compare_tensors(case: &Case, actual: &[Tensor], expected: &Value, what: &str) -> Outcome {
    let expected = expected
        .as_array()
        .ok_or_else(|| format!("{what}: expected a list"))?;
    if expected.len() != actual.len() {
        return Err(format!(
            "{what}: {} tensors, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    let mut exact = true;
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        exact &= compare_tensor(case, a, e, &format!("{what}[{j}]"))?.bit_exact;
    }
    Ok(exact)
}

/// Compares tensors that may be missing.
pub fn compare_optional_tensors(
    case: &Case,
    actual: &[Option<Tensor>],
    expected: &Value,
    what: &str,
) -> Outcome {
    let expected = expected
        .as_array()
        .ok_or_else(|| format!("{what}: expected a list"))?;
    if expected.len() != actual.len() {
        return Err(format!(
            "{what}: {} entries, expected {}",
            actual.len(),
            expected.len()
        ));
    }
    let mut exact = true;
    for (j, (a, e)) in actual.iter().zip(expected).enumerate() {
        match (a, e) {
            (None, Value::Null) => {}
            (Some(a), e) if !e.is_null() => {
                exact &= compare_tensor(case, a, e, &format!("{what}[{j}]"))?.bit_exact
            }
            _ => {
                return Err(format!(
                    "{what}[{j}]: presence differs (got {}, expected {e})",
                    a.is_some()
                ));
            }
        }
    }
    Ok(exact)
}

fn is_tensor(value: &Value) -> bool {
    value.get("dtype").is_some() && value.get("shape").is_some() && value.get("data").is_some()
}

/// Compares JSON values by the README's rules: dicts by key, numbers by value, tensors
/// within tolerance.
pub fn compare_json(case: &Case, actual: &Value, expected: &Value, path: &str) -> Outcome {
    match (actual, expected) {
        (a, e) if is_tensor(e) => {
            let tensor = tensor_from_json(a, path).map_err(|err| format!("{path}: {err}"))?;
            Ok(compare_tensor(case, &tensor, e, path)?.bit_exact)
        }
        (Value::Object(a), Value::Object(e)) => {
            let keys: BTreeSet<&String> = a.keys().chain(e.keys()).collect();
            let mut exact = true;
            for key in keys {
                match (a.get(key), e.get(key)) {
                    (Some(x), Some(y)) => {
                        exact &= compare_json(case, x, y, &format!("{path}.{key}"))?
                    }
                    (None, _) => return Err(format!("{path}: missing key {key:?}")),
                    (_, None) => return Err(format!("{path}: unexpected key {key:?}")),
                }
            }
            Ok(exact)
        }
        (Value::Array(a), Value::Array(e)) => {
            if a.len() != e.len() {
                return Err(format!("{path}: {} items, expected {}", a.len(), e.len()));
            }
            let mut exact = true;
            for (i, (x, y)) in a.iter().zip(e).enumerate() {
                exact &= compare_json(case, x, y, &format!("{path}[{i}]"))?;
            }
            Ok(exact)
        }
        (Value::Number(a), Value::Number(e)) => {
            if a.as_f64() == e.as_f64() {
                Ok(true)
            } else {
                Err(format!("{path}: {a} != expected {e}"))
            }
        }
        (a, e) if a == e => Ok(true),
        (a, e) => Err(format!("{path}: {a} != expected {e}")),
    }
}

/// Checks an expected error (and its step, when the case gives one).
pub fn expect_error(case: &Case, error: &Error, at_step: Option<usize>) -> Outcome {
    compare_error(case, error)?;
    if let Some(expected) = case.expected().get("error_at_step").and_then(Value::as_u64) {
        if at_step != Some(expected as usize) {
            return Err(format!(
                "error at step {at_step:?}, expected at step {expected}"
            ));
        }
    }
    Ok(true)
}

/// Checks the warnings emitted against `expected.warnings` (each expected text a substring of
/// an emitted one; an empty list means none). Cases without the field are not checked.
pub fn compare_warnings(case: &Case, emitted: &[String]) -> Result<(), String> {
    let Some(expected) = case.expected().get("warnings").and_then(Value::as_array) else {
        return Ok(());
    };
    if expected.is_empty() && !emitted.is_empty() {
        return Err(format!("expected no warnings, got {emitted:?}"));
    }
    for text in expected.iter().filter_map(Value::as_str) {
        if !emitted.iter().any(|w| w.contains(text)) {
            return Err(format!("missing warning {text:?}; emitted {emitted:?}"));
        }
    }
    Ok(())
}

/// `p + u` in the parameter's dtype (one correctly rounded addition), on the host: the
/// cases' local update.
pub fn add_update(param: &Tensor, update: &Tensor) -> Result<Tensor, String> {
    let (p, u) = (
        param.values_f64().map_err(|e| e.to_string())?,
        update.values_f64().map_err(|e| e.to_string())?,
    );
    let sum: Vec<f64> = p.iter().zip(&u).map(|(a, b)| a + b).collect();
    // f64 addition of two narrower values, rounded once to the dtype, is the dtype's addition.
    Tensor::from_f64(param.dtype(), param.shape(), &sum).map_err(|e| e.to_string())
}

pub fn usize_list(value: &Value) -> Vec<Option<usize>> {
    value
        .as_array()
        .map(|a| a.iter().map(|v| v.as_u64().map(|x| x as usize)).collect())
        .unwrap_or_default()
}
