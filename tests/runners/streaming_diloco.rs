//! `streaming_diloco`: torchft's `DiLoCo` with several fragments, `fragment_sync_delay` and
//! `fragment_update_alpha` (tests/torchft-cases/README.md): inner steps on every rank, each
//! fragment's all-reduce started `fragment_sync_delay` steps before its outer step, the outer
//! step's result mixed with the local parameters.

use std::sync::Arc;

use distopt::Backend;
use distopt::BlockOn;
use distopt::diloco::{DiLoCo, DiLoCoOptions};
use distopt::replicas::Replicas;
use serde_json::{Value, json};

use super::{Outcome, WorldFactory, compare_json, compare_tensors, optional_tensors, tensors};
use crate::common::Case;

/// The case's fragments (lists of global parameter indices).
fn fragments(input: &Value) -> Result<Vec<Vec<usize>>, String> {
    input["fragments"]
        .as_array()
        .ok_or("fragments")?
        .iter()
        .map(|f| {
            f.as_array()
                .ok_or("fragments[f]")?
                .iter()
                .map(|j| j.as_u64().map(|j| j as usize).ok_or("fragment index"))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()
        .map_err(str::to_string)
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
    let inner = super::diloco::build(&replicas, &input["inner_optimizer"])?;
    let outer = super::diloco::build(&replicas, &input["outer_optimizer"])?;
    let sync_every = input["sync_every"].as_i64().ok_or("sync_every")?;
    let options = DiLoCoOptions {
        fragments: Some(fragments(input)?),
        fragment_sync_delay: input["fragment_sync_delay"]
            .as_i64()
            .ok_or("fragment_sync_delay")?,
        // torchft mixes at every sync, at α = 0 too.
        fragment_update_alpha: Some(
            input["fragment_update_alpha"]
                .as_f64()
                .ok_or("fragment_update_alpha")?,
        ),
        ..DiLoCoOptions::default()
    };
    let mut diloco =
        DiLoCo::with_options(&replicas, inner, outer, sync_every, world.clone(), options)
            .map_err(|e| e.to_string())?;
    let delay = diloco.fragment_sync_delay();
    let mut exact = true;
    let (mut synced_at, mut prepared_at) = (Vec::new(), Vec::new());
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
        let before = diloco.pending_fragment();
        let applied = diloco
            .step_fragments(&mut replicas)
            .map_err(|e| format!("step {t}: {e}"))?;
        for &f in &applied {
            synced_at.push(json!([t, f]));
            if delay == 0 {
                // torchft prepares and performs in the same step without a delay.
                prepared_at.push(json!([t, f]));
            }
        }
        let after = diloco.pending_fragment();
        if let Some(f) = after.filter(|_| after != before) {
            prepared_at.push(json!([t, f]));
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
    for (what, actual) in [
        ("synced_at_steps", &synced_at),
        ("prepared_at_steps", &prepared_at),
    ] {
        if Value::Array(actual.clone()) != expected[what] {
            return Err(format!("{what}: {actual:?}, expected {}", expected[what]));
        }
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
        // The per-fragment outer states merged by global index (the case's README).
        exact &= compare_json(
            case,
            &sd["outer_optimizer"],
            &expected["outer_state_dict"],
            &format!("outer_state_dict (rank {rank})"),
        )?;
        exact &= compare_json(
            case,
            &sd["original_parameters"],
            &expected["original_parameters"],
            &format!("original_parameters (rank {rank})"),
        )?;
    }
    Ok(exact)
}
