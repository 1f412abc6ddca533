//! The JSON forms of tensors and numbers, as the golden cases and the seed's examples write
//! them (a step request's JSON form is the step's: `step::step_request_from_json`).
//!
//! A tensor is `{"dtype", "shape", "data"}` with flat row-major `data` (numbers, or the strings
//! `"nan"`, `"inf"`, `"-inf"`), or for convenience a nested list of numbers (float32). A missing
//! tensor is `null`.

use serde_json::{Value, json};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{HostData, Tensor, format_shape, numel_of};

/// Parses one element: a JSON number or `"nan"`, `"inf"`, `"-inf"`.
///
/// # Errors
/// A `ValueError` naming `what()` for a value that is neither a number nor one of those strings
/// (`"infinity"`, `"+inf"` and `"-infinity"` are accepted too, in any case).
pub fn number_from_json(value: &Value, what: &dyn Fn() -> String) -> Result<f64> {
    match value {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| Error::value(format!("{}: {n} is not a finite number", what()))),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "nan" => Ok(f64::NAN),
            "inf" | "infinity" | "+inf" => Ok(f64::INFINITY),
            "-inf" | "-infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(Error::value(format!(
                "{}: expected a number, \"nan\", \"inf\" or \"-inf\", got {value}",
                what()
            ))),
        },
        other => Err(Error::value(format!(
            "{}: expected a number, got {other}",
            what()
        ))),
    }
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Flattens a nested list of numbers, checking that it is rectangular.
fn flatten_nested(
    value: &Value,
    shape: &mut Vec<usize>,
    depth: usize,
    out: &mut Vec<f64>,
    what: &str,
) -> Result<()> {
    match value {
        Value::Array(items) => {
            if depth == shape.len() {
                if depth > 0 && !out.is_empty() {
                    return Err(Error::value(format!(
                        "{what}: ragged nested list (a list where a number was expected at depth {depth})"
                    )));
                }
                shape.push(items.len());
            } else if shape[depth] != items.len() {
                return Err(Error::value(format!(
                    "{what}: ragged nested list: a list of {} elements at depth {depth} where {} were expected",
                    items.len(),
                    shape[depth]
                )));
            }
            for item in items {
                flatten_nested(item, shape, depth + 1, out, what)?;
            }
            Ok(())
        }
        _ => {
            if depth != shape.len() {
                return Err(Error::value(format!(
                    "{what}: ragged nested list (a number where a list was expected at depth {depth})"
                )));
            }
            out.push(number_from_json(value, &|| what.to_string())?);
            Ok(())
        }
    }
}

/// Parses a tensor. `what` names it in errors (e.g. `"parameter 1 of rank 0"`). Unsupported
/// dtypes are reported as `unsupported dtype` `ValueError`s.
///
/// # Errors
/// A `ValueError` naming `what` for anything that is not such a tensor: another JSON type, an
/// object without a `dtype` string, a `shape` list of non-negative integers or a `data` list, an
/// unsupported dtype, data of another length than the shape needs, a ragged nested list, or an
/// element that [`number_from_json`] refuses.
pub fn tensor_from_json(value: &Value, what: &str) -> Result<Tensor> {
    match value {
        Value::Object(map) => {
            let dtype_name = map.get("dtype").and_then(Value::as_str).ok_or_else(|| {
                Error::value(format!("{what}: a tensor object needs a \"dtype\" string"))
            })?;
            let dtype = DType::parse(dtype_name)
                .map_err(|_| Error::value(format!("{what}: unsupported dtype {dtype_name}")))?;
            let shape = shape_from_json(map.get("shape"), what)?;
            let data = map.get("data").and_then(Value::as_array).ok_or_else(|| {
                Error::value(format!("{what}: a tensor object needs a \"data\" list"))
            })?;
            let numel = numel_of(&shape)?;
            if data.len() != numel {
                return Err(Error::value(format!(
                    "{what}: data has {} values but shape {} needs {numel}",
                    data.len(),
                    format_shape(&shape)
                )));
            }
            let values = data
                .iter()
                .enumerate()
                .map(|(i, v)| number_from_json(v, &|| format!("{what}, element {i}")))
                .collect::<Result<Vec<f64>>>()?;
            Tensor::new(&shape, HostData::from_f64(dtype, &values))
        }
        Value::Array(_) | Value::Number(_) => {
            let mut shape = Vec::new();
            let mut values = Vec::new();
            flatten_nested(value, &mut shape, 0, &mut values, what)?;
            Tensor::new(&shape, HostData::from_f64(DType::Float32, &values))
        }
        other => Err(Error::value(format!(
            "{what}: expected a tensor (a nested list or a {{\"dtype\", \"shape\", \"data\"}} object), got {}",
            describe(other)
        ))),
    }
}

fn shape_from_json(value: Option<&Value>, what: &str) -> Result<Vec<usize>> {
    let dims = value
        .and_then(Value::as_array)
        .ok_or_else(|| Error::value(format!("{what}: a tensor object needs a \"shape\" list")))?;
    dims.iter()
        .map(|d| {
            d.as_u64()
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| {
                    Error::value(format!(
                        "{what}: shape entries must be non-negative integers, got {d}"
                    ))
                })
        })
        .collect()
}

/// The golden-format JSON of a tensor (reads a device-resident tensor back first).
///
/// # Errors
/// As [`Tensor::to_host`]: a `RuntimeError` when a device readback fails (a GPU error, a lost
/// device).
pub async fn tensor_to_json(tensor: &Tensor) -> Result<Value> {
    let host = tensor.to_host().await?;
    let data = host.host_data().expect("host tensor");
    let values: Vec<Value> = (0..data.len())
        .map(|i| number_to_json(data.get_f64(i)))
        .collect();
    Ok(json!({"dtype": tensor.dtype().name(), "shape": tensor.shape(), "data": values}))
}

/// A float as JSON: a number, or `"nan"`, `"inf"`, `"-inf"`.
pub fn number_to_json(x: f64) -> Value {
    if x.is_nan() {
        Value::from("nan")
    } else if x.is_infinite() {
        Value::from(if x > 0.0 { "inf" } else { "-inf" })
    } else {
        Value::from(x)
    }
}

/// A JSON value's text for an error message, at most 64 characters (a user's 10 MB value is
/// not echoed back whole).
pub(crate) fn clip_json(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}
