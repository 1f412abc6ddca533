//! `post_local_sgd`: local optimizer steps plus model averaging over 4 ranks, with explicit
//! gradients or the DDP post-local-SGD hook's gradient synchronization, and state dict reloads.

use std::sync::Arc;

use distopt::BlockOn;
use distopt::averaging::{HierarchicalModelAverager, ModelAverager, PeriodicModelAverager};
use distopt::comm::{Communicator, local_index};
use distopt::post_local_sgd::{PostLocalSgdOptimizer, PostLocalSgdState};
use distopt::replicas::Replicas;
use distopt::{Backend, warnings};
use serde_json::Value;

use super::{
    Outcome, WorldFactory, compare_json, compare_optional_tensors, compare_tensors,
    compare_warnings, optional_tensors, per_rank_tensors, usize_list,
};
use crate::common::Case;

fn averager(spec: &Value, world: Arc<dyn Communicator>) -> Result<Box<dyn ModelAverager>, String> {
    let warmup = spec["warmup_steps"].as_i64().unwrap_or(0);
    Ok(match spec["type"].as_str() {
        Some("periodic") => Box::new(
            PeriodicModelAverager::new(spec["period"].as_i64().unwrap_or(0), warmup, world)
                .map_err(|e| e.to_string())?,
        ),
        Some("hierarchical") => {
            let dict: Vec<(i64, i64)> = spec["period_group_size_dict"]
                .as_array()
                .ok_or("period_group_size_dict")?
                .iter()
                .map(|p| (p[0].as_i64().unwrap_or(0), p[1].as_i64().unwrap_or(0)))
                .collect();
            Box::new(
                HierarchicalModelAverager::new(&dict, warmup, world).map_err(|e| e.to_string())?,
            )
        }
        other => return Err(format!("unknown averager type {other:?}")),
    })
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
    let (input, expected) = (case.input(), case.expected());
    let world_size = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let world = worlds(world_size)?;
    let local = world.local_ranks();
    let initial = per_rank_tensors(&input["initial_params"], "initial_params")?;
    let initial = initial
        .get(local.clone())
        .ok_or("initial_params: fewer ranks than the world")?;
    let mut replicas = Replicas::new(backend.clone(), initial).map_err(|e| e.to_string())?;
    let mut exact = true;
    let mut hook = None;
    if input["variant"] == "ddp_hook" {
        replicas
            .broadcast_params(world.as_ref(), 0)
            .map_err(|e| e.to_string())?;
        let params = replicas
            .all_params()
            .block_on()
            .map_err(|e| e.to_string())?;
        for (rank, p) in local.clone().zip(&params) {
            exact &= compare_tensors(
                case,
                p,
                &expected["params_after_ddp_init"][rank],
                "params_after_ddp_init",
            )?;
        }
        let h = &input["hook"];
        hook = Some(
            PostLocalSgdState::new(
                world.clone(),
                h["subgroup_size"].as_i64(),
                h["start_localSGD_iter"].as_u64().unwrap_or(0),
                h["post_local_gradient_allreduce"].as_bool().unwrap_or(true),
            )
            .map_err(|e| e.to_string())?,
        );
    }
    let inner =
        super::optimizers::build(&replicas, &input["optimizer"]).map_err(|e| e.to_string())?;
    let mut opt = PostLocalSgdOptimizer::new(inner, averager(&input["averager"], world.clone())?);
    let load = &input["load_state_dict"];
    let mut averaged_at = Vec::new();
    let mut sizes = Vec::new();
    let mut steps_before = Vec::new();
    for (t, step_grads) in input["grads"].as_array().ok_or("grads")?.iter().enumerate() {
        opt.zero_grad(&mut replicas);
        for rank in local.clone() {
            let grads = optional_tensors(&step_grads[rank], &format!("grads[{t}][{rank}]"))?;
            replicas
                .set_grads(rank - local.start, &grads)
                .map_err(|e| e.to_string())?;
        }
        if let Some(hook) = hook.as_mut() {
            hook.synchronize_gradients(&mut replicas)
                .map_err(|e| e.to_string())?;
            let grads = replicas.all_grads().block_on().map_err(|e| e.to_string())?;
            for (rank, g) in local.clone().zip(&grads) {
                exact &= compare_optional_tensors(
                    case,
                    g,
                    &expected["grads_seen"][t][rank],
                    &format!("grads_seen[{t}][{rank}]"),
                )?;
            }
        }
        steps_before.push(Some(opt.averager().step() as usize));
        let used = opt
            .step(&mut replicas)
            .map_err(|e| format!("step {t}: {e}"))?;
        if used.is_some() {
            averaged_at.push(Value::from(t));
        }
        sizes.push(used);
        let params = replicas
            .all_params()
            .block_on()
            .map_err(|e| e.to_string())?;
        for (rank, p) in local.clone().zip(&params) {
            exact &= compare_tensors(
                case,
                p,
                &expected["params_after_step"][t][rank],
                &format!("params_after_step[{t}][{rank}]"),
            )?;
        }
        if load.is_object() && load["after_step"].as_u64() == Some(t as u64 + 1) {
            let mut saved = Vec::new();
            for index in 0..local.len() {
                saved.push(
                    opt.state_dict(&replicas, index)
                        .block_on()
                        .map_err(|e| e.to_string())?,
                );
            }
            // Rank 0's state dict, in the process that holds rank 0.
            if let Some(index) = local_index(world.as_ref(), 0) {
                exact &= compare_json(
                    case,
                    &saved[index],
                    &expected["saved_state_dict"],
                    "saved_state_dict",
                )?;
            }
            if expected["averager_step_before_load"].as_u64() != Some(opt.averager().step()) {
                return Err(format!(
                    "averager step before load {}",
                    opt.averager().step()
                ));
            }
            // PyTorch reloads into the same instance; reloading into a freshly built one
            // (new local optimizer, new averager, no state) shows that the load restores
            // everything: a load that did nothing would restart momentum and the averager.
            let inner = super::optimizers::build(&replicas, &input["optimizer"])
                .map_err(|e| e.to_string())?;
            opt = PostLocalSgdOptimizer::new(inner, averager(&input["averager"], world.clone())?);
            for (index, mut sd) in saved.into_iter().enumerate() {
                if load["remove_step_key"].as_bool() == Some(true) {
                    sd.as_object_mut().ok_or("state dict")?.remove("step");
                }
                // Through JSON text, as a saved state dict would travel.
                let sd: Value = serde_json::from_str(&sd.to_string()).map_err(|e| e.to_string())?;
                opt.load_state_dict(&mut replicas, index, &sd)
                    .map_err(|e| e.to_string())?;
            }
            if expected["averager_step_after_load"].as_u64() != Some(opt.averager().step()) {
                return Err(format!(
                    "averager step after load {}",
                    opt.averager().step()
                ));
            }
        }
    }
    if Value::Array(averaged_at.clone()) != expected["averaged_at_steps"] {
        return Err(format!(
            "averaged at {averaged_at:?}, expected {}",
            expected["averaged_at_steps"]
        ));
    }
    if usize_list(&expected["averaging_group_size_at_step"]) != sizes {
        return Err(format!(
            "group sizes {sizes:?}, expected {}",
            expected["averaging_group_size_at_step"]
        ));
    }
    if usize_list(&expected["averager_step_before_each_step"]) != steps_before {
        return Err(format!(
            "averager steps {steps_before:?}, expected {}",
            expected["averager_step_before_each_step"]
        ));
    }
    if expected["final_averager_step"].as_u64() != Some(opt.averager().step()) {
        return Err(format!("final averager step {}", opt.averager().step()));
    }
    for rank in local.clone() {
        let sd = opt
            .state_dict(&replicas, rank - local.start)
            .block_on()
            .map_err(|e| e.to_string())?;
        exact &= compare_json(
            case,
            &sd,
            &expected["state_dict_per_rank"][rank],
            &format!("state_dict_per_rank[{rank}]"),
        )?;
        if rank == 0 {
            exact &= compare_json(case, &sd, &expected["state_dict_rank0"], "state_dict_rank0")?;
        }
    }
    Ok(exact)
}
