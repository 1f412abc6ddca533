//! Optimizer options as PyTorch keeps them: a map of hyper-parameters per parameter group,
//! printed verbatim into `state_dict()["param_groups"]`.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Hyper-parameters by PyTorch's keyword names (`lr`, `momentum`, `betas`, …).
pub type OptionMap = Map<String, Value>;

/// Parses a JSON object into an [`OptionMap`].
pub fn option_map(value: &Value) -> Result<OptionMap> {
    match value {
        Value::Object(map) => Ok(map.clone()),
        Value::Null => Ok(OptionMap::new()),
        other => Err(Error::type_error(format!(
            "optimizer options must be an object, got {other}"
        ))),
    }
}

/// `defaults` overridden by `given`; unknown keys are PyTorch's `TypeError`.
pub(crate) fn merge(class: &str, defaults: &OptionMap, given: &OptionMap) -> Result<OptionMap> {
    let mut merged = defaults.clone();
    for (key, value) in given {
        if key == "params" {
            continue;
        }
        if !defaults.contains_key(key) {
            return Err(Error::type_error(format!(
                "{class}.__init__() got an unexpected keyword argument '{key}'"
            )));
        }
        merged.insert(key.clone(), value.clone());
    }
    Ok(merged)
}

pub(crate) fn number(options: &OptionMap, key: &str) -> Result<f64> {
    match options.get(key) {
        Some(Value::Number(n)) => n
            .as_f64()
            .ok_or_else(|| Error::type_error(format!("option '{key}' must be a number"))),
        Some(Value::Bool(b)) => Ok(f64::from(u8::from(*b))),
        Some(other) => Err(Error::type_error(format!(
            "option '{key}' must be a number, got {other}"
        ))),
        None => Err(Error::value(format!("option '{key}' is missing"))),
    }
}

pub(crate) fn flag(options: &OptionMap, key: &str) -> Result<bool> {
    match options.get(key) {
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::Null) | None => Ok(false),
        Some(Value::Number(n)) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
        Some(other) => Err(Error::type_error(format!(
            "option '{key}' must be a boolean, got {other}"
        ))),
    }
}

pub(crate) fn pair(options: &OptionMap, key: &str) -> Result<(f64, f64)> {
    let items = options
        .get(key)
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .ok_or_else(|| Error::type_error(format!("option '{key}' must be a pair of numbers")))?;
    let get = |v: &Value| {
        v.as_f64()
            .ok_or_else(|| Error::type_error(format!("option '{key}' must be a pair of numbers")))
    };
    Ok((get(&items[0])?, get(&items[1])?))
}

/// Builds a map from `(key, value)` pairs.
pub(crate) fn map(entries: &[(&str, Value)]) -> OptionMap {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}
