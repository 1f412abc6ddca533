//! `distributed_optimizer`: per-owner local optimizers over RPC, from distributed autograd
//! contexts, on the functional and the `torch.optim` paths.

use std::sync::Arc;

use distopt::BlockOn;
use distopt::json::tensor_from_json;
use distopt::optim::option_map;
use distopt::rpc::{DRIVER, DistributedOptimizer, LocalOptimizerKind, RRef, RpcWorld};
use distopt::{Backend, Tensor, warnings};
use serde_json::Value;

use super::{
    Outcome, compare_optional_tensors, compare_tensors, compare_warnings, optional_tensors,
};
use crate::common::Case;

fn s(e: distopt::Error) -> String {
    e.to_string()
}

pub fn run(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    warnings::take();
    let outcome = run_inner(backend, case);
    let emitted = warnings::take();
    let exact = outcome?;
    compare_warnings(case, &emitted)?;
    Ok(exact)
}

fn run_inner(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let workers = input["workers"].as_u64().ok_or("workers")? as usize;
    let names: Vec<String> = (0..workers).map(|k| format!("worker{k}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let world = Arc::new(RpcWorld::new(&refs, backend.clone()).map_err(s)?);
    let mut rrefs: Vec<RRef> = Vec::new();
    for (i, p) in input["params"]
        .as_array()
        .ok_or("params")?
        .iter()
        .enumerate()
    {
        let owner = match p["owner"].as_i64() {
            Some(-1) => DRIVER.to_string(),
            Some(k) => format!("worker{k}"),
            None => return Err(format!("params[{i}].owner")),
        };
        let initial = tensor_from_json(&p["initial"], "initial").map_err(s)?;
        rrefs.push(world.remote(&owner, initial).map_err(s)?);
    }
    let kind = match input["local_optimizer"].as_str() {
        Some("functional") => LocalOptimizerKind::Functional,
        _ => LocalOptimizerKind::TorchOptim,
    };
    let name = input["optimizer"]["name"].as_str().unwrap_or_default();
    let options = option_map(&input["optimizer"]["options"]).map_err(s)?;
    let dopt = DistributedOptimizer::new(world.clone(), name, &rrefs, &options, kind).map_err(s)?;
    let mut exact = true;
    for (t, grads) in input["grads"].as_array().ok_or("grads")?.iter().enumerate() {
        let grads = optional_tensors(grads, &format!("grads[{t}]"))?;
        let context = world.context();
        for (rref, grad) in rrefs.iter().zip(&grads) {
            if let Some(g) = grad {
                pollster::block_on(world.record_gradient(context.id(), rref, g.clone()))
                    .map_err(s)?;
            }
        }
        dopt.step(context.id())
            .block_on()
            .map_err(|e| format!("step {t}: {e}"))?;
        let mut params = Vec::new();
        let mut in_context = Vec::new();
        let mut grad_attr: Vec<Option<Tensor>> = Vec::new();
        for rref in &rrefs {
            params.push(pollster::block_on(rref.to_here(&world)).map_err(s)?);
            let all =
                pollster::block_on(world.get_gradients(context.id(), rref.owner())).map_err(s)?;
            in_context.push(all.get(&rref.id()).cloned());
            let id = rref.id();
            grad_attr.push(
                world
                    .rpc_sync(rref.owner(), move |state| Ok(state.grad(id).cloned()))
                    .map_err(s)?,
            );
        }
        exact &= compare_tensors(
            case,
            &params,
            &expected["params_after_step"][t],
            &format!("params_after_step[{t}]"),
        )?;
        exact &= compare_optional_tensors(
            case,
            &in_context,
            &expected["grads_in_context"][t],
            &format!("grads_in_context[{t}]"),
        )?;
        exact &= compare_optional_tensors(
            case,
            &grad_attr,
            &expected["param_grad_attr_after_step"][t],
            &format!("param_grad_attr_after_step[{t}]"),
        )?;
    }
    if expected["is_functional_optim"].as_bool() != Some(dopt.is_functional_optim()) {
        return Err("is_functional_optim differs".into());
    }
    let locals: Vec<Value> = dopt
        .local_optimizers()
        .into_iter()
        .map(|info| {
            let owner = if info.owner == DRIVER {
                -1
            } else {
                info.owner
                    .trim_start_matches("worker")
                    .parse::<i64>()
                    .unwrap_or(-2)
            };
            serde_json::json!({"owner": owner, "param_indices": info.param_indices})
        })
        .collect();
    if Value::Array(locals.clone()) != expected["local_optimizers"] {
        return Err(format!(
            "local_optimizers {locals:?}, expected {}",
            expected["local_optimizers"]
        ));
    }
    Ok(exact)
}
