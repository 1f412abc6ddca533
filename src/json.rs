//! The JSON forms of tensors and step requests, as the golden cases and the seed's examples
//! write them.
//!
//! A tensor is `{"dtype", "shape", "data"}` with flat row-major `data` (numbers, or the strings
//! `"nan"`, `"inf"`, `"-inf"`), or for convenience a nested list of numbers (float32). A missing
//! tensor is `null`.

use serde_json::{Map, Value, json};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::step::{StepOutput, errors};
use crate::tensor::{HostData, Tensor, format_shape, numel_of};

/// A parsed `{"parameter_replicas", "gradient_replicas", "learning_rate"}` request.
#[derive(Debug, Clone)]
pub struct StepRequest {
    /// `[rank][param]`.
    pub parameter_replicas: Vec<Vec<Tensor>>,
    /// `[rank][param]`, `None` for a missing gradient.
    pub gradient_replicas: Vec<Vec<Option<Tensor>>>,
    /// The learning rate (rounded to float32 by the step).
    pub learning_rate: f64,
}

/// Parses one element: a JSON number or `"nan"`, `"inf"`, `"-inf"`.
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

fn list<'a>(value: Option<&'a Value>, what: &str) -> Result<&'a Vec<Value>> {
    value
        .and_then(Value::as_array)
        .ok_or_else(|| Error::value(format!("{what} must be a list")))
}

/// Parses a step request, checking it in the reference order so that the first defect is the
/// one reported (counts, then for each parameter and rank: dtype, shape, gradient dtype,
/// gradient shape).
pub fn step_request_from_json(value: &Value) -> Result<StepRequest> {
    let object = value
        .as_object()
        .ok_or_else(|| Error::value("a step request must be a JSON object with parameter_replicas, gradient_replicas and learning_rate"))?;
    let params = list(object.get("parameter_replicas"), "parameter_replicas")?;
    let grads = list(object.get("gradient_replicas"), "gradient_replicas")?;
    let learning_rate = number_from_json(
        object
            .get("learning_rate")
            .ok_or_else(|| Error::value("learning_rate is missing"))?,
        &|| "learning_rate".to_string(),
    )?;
    let ranks = params.len();
    if ranks == 0 {
        return Err(errors::no_replicas());
    }
    if grads.len() != ranks {
        return Err(errors::gradient_replica_count(grads.len(), ranks));
    }
    let mut param_lists = Vec::with_capacity(ranks);
    let mut grad_lists = Vec::with_capacity(ranks);
    for rank in 0..ranks {
        param_lists.push(list(
            Some(&params[rank]),
            &format!("parameter_replicas[{rank}]"),
        )?);
        grad_lists.push(list(
            Some(&grads[rank]),
            &format!("gradient_replicas[{rank}]"),
        )?);
    }
    let count = param_lists[0].len();
    for rank in 0..ranks {
        if param_lists[rank].len() != count {
            return Err(errors::param_count(rank, param_lists[rank].len(), count));
        }
        if grad_lists[rank].len() != count {
            return Err(errors::gradient_count(rank, grad_lists[rank].len(), count));
        }
    }
    let mut parameter_replicas: Vec<Vec<Tensor>> =
        (0..ranks).map(|_| Vec::with_capacity(count)).collect();
    let mut gradient_replicas: Vec<Vec<Option<Tensor>>> =
        (0..ranks).map(|_| Vec::with_capacity(count)).collect();
    for j in 0..count {
        for rank in 0..ranks {
            let param = parse_checked(&param_lists[rank][j], "parameter", j, rank)?;
            let expected = if rank == 0 {
                param.shape().to_vec()
            } else {
                parameter_replicas[0][j].shape().to_vec()
            };
            if param.shape() != expected {
                return Err(errors::param_shape(j, rank, param.shape(), &expected));
            }
            let grad = match &grad_lists[rank][j] {
                Value::Null => None,
                g => {
                    let grad = parse_checked(g, "gradient", j, rank)?;
                    if grad.shape() != param.shape() {
                        return Err(errors::gradient_shape(j, rank, grad.shape(), param.shape()));
                    }
                    Some(grad)
                }
            };
            parameter_replicas[rank].push(param);
            gradient_replicas[rank].push(grad);
        }
    }
    Ok(StepRequest {
        parameter_replicas,
        gradient_replicas,
        learning_rate,
    })
}

/// Parses parameter/gradient `j` of `rank`, reporting a non-float dtype in the step's words.
fn parse_checked(value: &Value, what: &str, j: usize, rank: usize) -> Result<Tensor> {
    if let Some(name) = value.get("dtype").and_then(Value::as_str) {
        if DType::parse(name).is_err() {
            return Err(errors::unsupported_dtype(what, name, j, rank));
        }
    }
    tensor_from_json(value, &format!("{what} {j} of rank {rank}"))
}

/// The golden-format JSON of a step's result.
pub async fn step_output_to_json(output: &StepOutput) -> Result<Value> {
    let mut means = Vec::with_capacity(output.mean_gradients.len());
    for t in &output.mean_gradients {
        means.push(tensor_to_json(t).await?);
    }
    let mut replicas = Vec::with_capacity(output.updated_replicas.len());
    for rank in &output.updated_replicas {
        let mut tensors = Vec::with_capacity(rank.len());
        for t in rank {
            tensors.push(tensor_to_json(t).await?);
        }
        replicas.push(Value::Array(tensors));
    }
    let mut object = Map::new();
    object.insert("mean_gradients".into(), Value::Array(means));
    object.insert("updated_replicas".into(), Value::Array(replicas));
    Ok(Value::Object(object))
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
