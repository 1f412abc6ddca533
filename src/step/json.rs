//! The JSON forms of a step request and a step's result, as the golden cases and the seed's
//! examples write them.

use serde_json::{Map, Value};

use super::StepOutput;
use super::request::{StepRequest, StepSource, errors, read_replicas};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::json::{number_from_json, tensor_from_json, tensor_to_json};
use crate::tensor::Tensor;

/// A request's replica lists as JSON arrays.
struct JsonSource<'a> {
    params: &'a [Value],
    grads: &'a [Value],
    param_lists: Vec<&'a Vec<Value>>,
    grad_lists: Vec<&'a Vec<Value>>,
}

impl StepSource for JsonSource<'_> {
    type Item = Tensor;
    fn ranks(&mut self) -> (usize, usize) {
        (self.params.len(), self.grads.len())
    }
    fn counts(&mut self, rank: usize) -> Result<(usize, usize)> {
        let params = list(
            Some(&self.params[rank]),
            &format!("parameter_replicas[{rank}]"),
        )?;
        let grads = list(
            Some(&self.grads[rank]),
            &format!("gradient_replicas[{rank}]"),
        )?;
        self.param_lists.push(params);
        self.grad_lists.push(grads);
        Ok((params.len(), grads.len()))
    }
    fn param(&mut self, rank: usize, j: usize) -> Result<Tensor> {
        parse_checked(&self.param_lists[rank][j], "parameter", j, rank)
    }
    fn grad(&mut self, rank: usize, j: usize) -> Result<Option<Tensor>> {
        match &self.grad_lists[rank][j] {
            Value::Null => Ok(None),
            g => parse_checked(g, "gradient", j, rank).map(Some),
        }
    }
    fn shape(item: &Tensor) -> &[usize] {
        item.shape()
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
///
/// # Errors
/// A `ValueError` for the first defect: a value that is not an object, a missing or non-list
/// `parameter_replicas` or `gradient_replicas`, a missing or non-numeric `learning_rate`, then in
/// the reference order a rank's entry that is not a list, the count and shape mismatches of
/// [`errors`], an unsupported dtype ([`errors::unsupported_dtype`]) or a malformed tensor
/// ([`tensor_from_json`]).
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
    let (parameter_replicas, gradient_replicas) = read_replicas(&mut JsonSource {
        params,
        grads,
        param_lists: Vec::new(),
        grad_lists: Vec::new(),
    })?;
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
///
/// # Errors
/// As [`tensor_to_json`]: a `RuntimeError` when the readback of a device-resident output fails (a
/// GPU error, a lost device).
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
