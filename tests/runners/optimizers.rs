//! `local_optimizer`: single-process SGD/Adam/AdamW trajectories and state dicts.

use std::sync::Arc;

use distopt::Backend;
use distopt::BlockOn;
use distopt::optim::{self, option_map};
use distopt::replicas::Replicas;
use serde_json::Value;

use super::{Outcome, compare_json, compare_tensors, expect_error, optional_tensors, tensors};
use crate::common::Case;

/// Builds the optimizer a case names, over every parameter in one group.
pub fn build(
    replicas: &Replicas,
    spec: &Value,
) -> Result<Box<dyn optim::LocalOptimizer>, distopt::Error> {
    let name = spec["name"].as_str().unwrap_or_default();
    let options = option_map(&spec["options"])?;
    optim::create(
        name,
        replicas,
        vec![((0..replicas.len()).collect(), Default::default())],
        &options,
    )
}

pub fn run(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let input = case.input();
    let initial = tensors(&input["initial_params"], "initial_params")?;
    let mut replicas =
        Replicas::replicate(backend.clone(), 1, &initial).map_err(|e| e.to_string())?;
    let mut optimizer = match build(&replicas, &input["optimizer"]) {
        Ok(o) => o,
        Err(err) => return expect_error(case, &err, None),
    };
    if case.expected().get("error").is_some() {
        return Err("expected a constructor error".into());
    }
    let steps = input["grads"].as_array().ok_or("grads")?;
    let expected_params = case.expected()["params_after_step"]
        .as_array()
        .ok_or("params_after_step")?;
    let mut exact = true;
    for (t, grads) in steps.iter().enumerate() {
        optimizer.zero_grad(&mut replicas);
        let grads = optional_tensors(grads, &format!("grads[{t}]"))?;
        replicas.set_grads(0, &grads).map_err(|e| e.to_string())?;
        optimizer
            .step(&mut replicas)
            .map_err(|e| format!("step {t}: {e}"))?;
        let params = replicas
            .all_params()
            .block_on()
            .map_err(|e| e.to_string())?;
        exact &= compare_tensors(
            case,
            &params[0],
            &expected_params[t],
            &format!("params_after_step[{t}]"),
        )?;
    }
    let state_dict =
        pollster::block_on(optimizer.state_dict(&replicas, 0)).map_err(|e| e.to_string())?;
    exact &= compare_json(
        case,
        &state_dict,
        &case.expected()["state_dict"],
        "state_dict",
    )?;
    Ok(exact)
}
