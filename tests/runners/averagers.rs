//! `periodic_averager` and `hierarchical_averager`: W ranks apply local updates, then average.

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::{HierarchicalModelAverager, ModelAverager, PeriodicModelAverager};
use distopt::comm::Communicator;
use distopt::replicas::Replicas;
use distopt::{Backend, Tensor, warnings};
use serde_json::Value;

use super::{
    Outcome, WorldFactory, add_update, compare_tensors, compare_warnings, expect_error,
    per_rank_tensors, usize_list,
};
use crate::common::Case;

fn construct(
    case: &Case,
    world: Arc<dyn Communicator>,
) -> Result<Box<dyn ModelAverager>, distopt::Error> {
    let input = case.input();
    let warmup = input["warmup_steps"].as_i64().unwrap_or(0);
    if case.kind == "periodic_averager" {
        let period = input["period"].as_i64().unwrap_or(0);
        Ok(Box::new(PeriodicModelAverager::new(period, warmup, world)?))
    } else {
        let dict: Vec<(i64, i64)> = input["period_group_size_dict"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|pair| (pair[0].as_i64().unwrap_or(0), pair[1].as_i64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Box::new(HierarchicalModelAverager::new(
            &dict, warmup, world,
        )?))
    }
}

/// Runs the case on the world `worlds` builds, over this process's ranks only.
pub fn run(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    warnings::take();
    let outcome = run_inner(backend, case, worlds);
    let emitted = warnings::take();
    let exact = outcome?;
    compare_warnings(case, &emitted)?;
    Ok(exact)
}

fn run_inner(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    let input = case.input();
    let world_size = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let world = worlds(world_size)?;
    let local = world.local_ranks();
    let mut averager = match construct(case, world) {
        Ok(a) => a,
        Err(err) => return expect_error(case, &err, None),
    };
    let expected = case.expected();
    let initial = per_rank_tensors(&input["initial_params"], "initial_params")?;
    let initial = initial
        .get(local.clone())
        .ok_or("initial_params: fewer ranks than the world")?;
    let mut replicas = Replicas::new(backend.clone(), initial).map_err(|e| e.to_string())?;
    let has_grad: Vec<bool> = input["param_has_grad"]
        .as_array()
        .ok_or("param_has_grad")?
        .iter()
        .map(|b| b.as_bool().unwrap_or(false))
        .collect();
    for (index, rank_params) in initial.iter().enumerate() {
        let grads: Vec<Option<Tensor>> = rank_params
            .iter()
            .zip(&has_grad)
            .map(|(p, &has)| {
                has.then(|| Tensor::from_f64(p.dtype(), p.shape(), &vec![0.0; p.numel()]).unwrap())
            })
            .collect();
        replicas
            .set_grads(index, &grads)
            .map_err(|e| e.to_string())?;
    }
    let updates = input["updates"].as_array().ok_or("updates")?;
    let mut averaged_at = Vec::new();
    let mut group_sizes = Vec::new();
    let mut exact = true;
    for (t, step_updates) in updates.iter().enumerate() {
        let params = replicas
            .all_params()
            .block_on()
            .map_err(|e| e.to_string())?;
        let step_updates = per_rank_tensors(step_updates, &format!("updates[{t}]"))?;
        for rank in local.clone() {
            let index = rank - local.start;
            let rank_updates = step_updates
                .get(rank)
                .ok_or_else(|| format!("updates[{t}][{rank}]: missing"))?;
            let updated: Vec<Tensor> = params[index]
                .iter()
                .zip(rank_updates)
                .map(|(p, u)| add_update(p, u))
                .collect::<Result<_, _>>()?;
            replicas
                .set_params(index, &updated)
                .map_err(|e| e.to_string())?;
        }
        match averager.average_parameters(&mut replicas, None) {
            Ok(used) => {
                if used.is_some() {
                    averaged_at.push(Value::from(t));
                }
                group_sizes.push(used);
            }
            Err(err) => return expect_error(case, &err, Some(t)),
        }
        if expected.get("error").is_some() {
            continue;
        }
        let params = replicas
            .all_params()
            .block_on()
            .map_err(|e| e.to_string())?;
        for (rank, rank_params) in local.clone().zip(&params) {
            exact &= compare_tensors(
                case,
                rank_params,
                &expected["params_after_step"][t][rank],
                &format!("params_after_step[{t}][{rank}]"),
            )?;
        }
    }
    if expected.get("error").is_some() {
        return Err("expected an error, none was raised".into());
    }
    if Value::Array(averaged_at.clone()) != expected["averaged_at_steps"] {
        return Err(format!(
            "averaged at {averaged_at:?}, expected {}",
            expected["averaged_at_steps"]
        ));
    }
    if let Some(sizes) = expected.get("group_size_used_at_step") {
        if usize_list(sizes) != group_sizes {
            return Err(format!("group sizes {group_sizes:?}, expected {sizes}"));
        }
    }
    if expected["final_step_counter"].as_u64() != Some(averager.step()) {
        return Err(format!(
            "final step {}, expected {}",
            averager.step(),
            expected["final_step_counter"]
        ));
    }
    Ok(exact)
}
