//! `diloco`: inner optimizer steps on every rank, and every `sync_every` steps the world's
//! mean pseudo-gradient applied by the outer optimizer (README section 13b).

use std::sync::Arc;

use distopt::Backend;
use distopt::BlockOn;
use distopt::diloco::DiLoCo;
use distopt::optim::LocalOptimizer;
use distopt::replicas::Replicas;
use serde_json::Value;

use super::{Outcome, WorldFactory, compare_json, compare_tensors, optional_tensors, tensors};
use crate::common::Case;

/// The case's optimizer over every parameter, with `foreach=False` as the reference passes it.
pub fn build(replicas: &Replicas, spec: &Value) -> Result<Box<dyn LocalOptimizer>, String> {
    let mut spec = spec.clone();
    if let Some(options) = spec.get_mut("options").and_then(Value::as_object_mut) {
        options
            .entry("foreach")
            .or_insert_with(|| Value::Bool(false));
    }
    super::optimizers::build(replicas, &spec).map_err(|e| e.to_string())
}

/// Runs the case on the world `worlds` builds, over this process's ranks only.
pub fn run(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let world_size = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let world = worlds(world_size)?;
    let local = world.local_ranks();
    let initial = tensors(&input["initial_params"], "initial_params")?;
    let mut replicas =
        Replicas::replicate(backend.clone(), local.len(), &initial).map_err(|e| e.to_string())?;
    let inner = build(&replicas, &input["inner_optimizer"])?;
    let outer = build(&replicas, &input["outer_optimizer"])?;
    let sync_every = input["sync_every"].as_i64().ok_or("sync_every")?;
    let mut diloco = DiLoCo::new(&replicas, inner, outer, sync_every, world.clone())
        .map_err(|e| e.to_string())?;
    let mut exact = true;
    let mut synced_at = Vec::new();
    let steps = input["grads"].as_array().ok_or("grads")?;
    let recorded = expected["params_after_step"].as_array().map_or(0, Vec::len);
    let inner_states = expected["inner_state_dicts"].as_array().map_or(0, Vec::len);
    if recorded != steps.len() || inner_states != world_size {
        return Err(format!(
            "the case records {recorded} steps and {inner_states} inner state dicts for {} steps of {world_size} ranks",
            steps.len()
        ));
    }
    for (t, step_grads) in steps.iter().enumerate() {
        diloco.zero_grad(&mut replicas);
        for rank in local.clone() {
            let grads = optional_tensors(&step_grads[rank], &format!("grads[{t}][{rank}]"))?;
            replicas
                .set_grads(rank - local.start, &grads)
                .map_err(|e| e.to_string())?;
        }
        if diloco
            .step(&mut replicas)
            .map_err(|e| format!("step {t}: {e}"))?
        {
            synced_at.push(Value::from(t));
        }
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
    }
    if Value::Array(synced_at.clone()) != expected["synced_at_steps"] {
        return Err(format!(
            "synced at {synced_at:?}, expected {}",
            expected["synced_at_steps"]
        ));
    }
    for rank in local.clone() {
        let index = rank - local.start;
        let sd = diloco
            .state_dict(&replicas, index)
            .block_on()
            .map_err(|e| e.to_string())?;
        exact &= compare_json(
            case,
            &sd["inner_optimizer"],
            &expected["inner_state_dicts"][rank],
            &format!("inner_state_dicts[{rank}]"),
        )?;
        // Every rank's outer state is the same; the case records rank 0's.
        exact &= compare_json(
            case,
            &sd["outer_optimizer"],
            &expected["outer_state_dict"],
            &format!("outer_state_dict (rank {rank})"),
        )?;
    }
    Ok(exact)
}
