//! Optimizer options as PyTorch keeps them: a map of hyper-parameters per parameter group,
//! printed verbatim into `state_dict()["param_groups"]`.

use serde_json::{Map, Value};

use super::kind::OptimizerKind;
use crate::error::{Error, Result};

/// The typed hyper-parameters of one parameter group of an optimizer: parsed once from an
/// [`OptionMap`] (at construction, `add_param_group` and `load_state_dict`), read by every step.
/// Sealed: implemented by the crate's options only.
pub trait GroupOptions:
    super::sealed::Sealed + Clone + std::fmt::Debug + crate::backend::MaybeSendSync + 'static
{
    /// The complete defaults of `kind` as PyTorch's `optimizer.defaults` lists them
    /// (`foreach`, `fused`, … included).
    fn defaults(kind: OptimizerKind) -> OptionMap;

    /// Reads the options from a complete map.
    ///
    /// # Errors
    /// A `TypeError` for an option of the wrong type, a `ValueError` for a missing one.
    fn from_map(map: &OptionMap) -> Result<Self>;

    /// PyTorch's constructor checks of the defaults, in its order and with its texts.
    ///
    /// # Errors
    /// The `ValueError` PyTorch raises (`Invalid learning rate: -0.1`, …).
    fn validate(&self) -> Result<()>;
}

/// Hyper-parameters by PyTorch's keyword names (`lr`, `momentum`, `betas`, …).
pub type OptionMap = Map<String, Value>;

/// Parses a JSON object into an [`OptionMap`].
///
/// # Errors
/// A `TypeError` for a value that is neither an object nor `null` (which is the empty map).
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

/// The checks PyTorch's SGD and Adam constructors make of `fused=True` once the parameter
/// groups are in place, in their order.
///
/// # Errors
/// PyTorch's `RuntimeError`s: `fused` with `differentiable`, or with `foreach`.
pub(crate) fn check_fused(defaults: &OptionMap) -> Result<()> {
    if !flag(defaults, "fused")? {
        return Ok(());
    }
    if flag(defaults, "differentiable")? {
        return Err(Error::runtime("`fused` does not support `differentiable`"));
    }
    if flag(defaults, "foreach")? {
        return Err(Error::runtime(
            "`fused` and `foreach` cannot be `True` together.",
        ));
    }
    Ok(())
}

/// PyTorch's `ValueError` for a hyper-parameter out of range: `Invalid {what}: {x}`, `x` as
/// Python writes it (`Invalid learning rate: -0.1`).
pub(crate) fn invalid(what: &str, x: f64) -> Error {
    Error::value(format!("Invalid {what}: {}", crate::pyfmt::float_repr(x)))
}

/// A float option: a JSON number, or `"nan"`, `"inf"`, `"-inf"` (how distopt writes
/// non-finite floats in JSON; see [`crate::json::number_to_json`]), or a boolean (Python's
/// `True == 1`).
pub(crate) fn number(options: &OptionMap, key: &str) -> Result<f64> {
    match options.get(key) {
        Some(Value::Bool(b)) => Ok(f64::from(u8::from(*b))),
        Some(value) => float(value).ok_or_else(|| {
            Error::type_error(format!(
                "option '{key}' must be a number, got {}",
                crate::json::clip_json(value)
            ))
        }),
        None => Err(Error::value(format!("option '{key}' is missing"))),
    }
}

/// A JSON number or a non-finite float's string.
fn float(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "nan" => Some(f64::NAN),
            "inf" => Some(f64::INFINITY),
            "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// A float as an option's JSON value (non-finite floats as strings).
pub(crate) fn float_json(x: f64) -> Value {
    crate::json::number_to_json(x)
}

pub(crate) fn flag(options: &OptionMap, key: &str) -> Result<bool> {
    match options.get(key) {
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::Null) | None => Ok(false),
        Some(Value::Number(n)) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
        Some(other) => Err(Error::type_error(format!(
            "option '{key}' must be a boolean, got {}",
            crate::json::clip_json(other)
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
        float(v)
            .ok_or_else(|| Error::type_error(format!("option '{key}' must be a pair of numbers")))
    };
    Ok((get(&items[0])?, get(&items[1])?))
}

/// Adds PyTorch's `fused` and `foreach` to `map` where set (PyTorch prints their defaults as
/// `None`).
pub(crate) fn insert_paths(map: &mut OptionMap, fused: bool, foreach: bool) {
    for (key, set) in [("fused", fused), ("foreach", foreach)] {
        if set {
            map.insert(key.into(), Value::Bool(true));
        }
    }
}

/// Builds a map from `(key, value)` pairs.
pub(crate) fn map(entries: &[(&str, Value)]) -> OptionMap {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}
