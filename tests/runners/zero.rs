//! The `zero_*` kinds: partition, trajectories (with reloads into other world sizes), errors
//! and warnings, and the join hook with uneven inputs.

use std::ops::Range;
use std::sync::Arc;

use distopt::comm::{Communicator, SimulatedWorld, local_index};
use distopt::json::tensor_from_json;
use distopt::optim::option_map;
use distopt::replicas::Replicas;
use distopt::zero::args::{ParamItem, ParamsArg, TensorArg, validate};
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, DType, Error, Tensor, warnings};
use serde_json::Value;

use super::{
    Outcome, WorldFactory, compare_json, compare_optional_tensors, compare_tensors,
    compare_warnings, optional_tensors, tensors,
};
use crate::common::{Case, compare_error};

fn s(e: Error) -> String {
    e.to_string()
}

fn indices(value: &Value) -> Vec<usize> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default()
}

fn nested_indices(value: &Value) -> Vec<Vec<usize>> {
    value
        .as_array()
        .map(|a| a.iter().map(indices).collect())
        .unwrap_or_default()
}

fn zero_tensor(dtype: DType, shape: &[usize]) -> Tensor {
    let numel = shape.iter().product();
    Tensor::from_f64(dtype, shape, &vec![0.0; numel]).expect("zero tensor")
}

fn shape_of(value: &Value) -> Vec<usize> {
    indices(&value["shape"])
}

/// Runs a `zero_*` case on the simulated world.
pub fn run(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    run_with_world(backend, case, &super::simulated_world)
}

/// Runs a `zero_*` case. `zero_trajectory` runs on the worlds `worlds` builds, over this
/// process's ranks only; the other kinds always run on the simulated world.
pub fn run_with_world(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    warnings::take();
    let outcome = match case.kind.as_str() {
        "zero_partition" => partition(backend, case),
        "zero_trajectory" => trajectory(backend, case, worlds),
        "zero_errors" => errors(backend, case),
        "zero_join" => join(backend, case),
        other => Err(format!("unknown kind {other}")),
    };
    let emitted = warnings::take();
    let exact = outcome?;
    compare_warnings(case, &emitted)?;
    Ok(exact)
}

fn world(size: usize) -> Result<Arc<SimulatedWorld>, String> {
    SimulatedWorld::new(size).map(Arc::new).map_err(s)
}

fn partition(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let mut shapes = Vec::new();
    let mut groups = Vec::new();
    for group in input["param_groups"].as_array().ok_or("param_groups")? {
        let first = shapes.len();
        for shape in group["shapes"].as_array().ok_or("shapes")? {
            shapes.push(indices(shape));
        }
        groups.push((
            (first..shapes.len()).collect::<Vec<_>>(),
            option_map(&group["options"]).map_err(s)?,
        ));
    }
    let added = &input["add_param_group"];
    let mut added_range = shapes.len()..shapes.len();
    if added.is_object() {
        for shape in added["shapes"].as_array().ok_or("shapes")? {
            shapes.push(indices(shape));
        }
        added_range.end = shapes.len();
    }
    let templates: Vec<Tensor> = shapes
        .iter()
        .map(|sh| zero_tensor(DType::Float32, sh))
        .collect();
    let replicas = Replicas::replicate(backend.clone(), w, &templates).map_err(s)?;
    let mut defaults = serde_json::Map::new();
    defaults.insert("lr".into(), Value::from(0.01));
    let mut zero = ZeroRedundancyOptimizer::new(
        world(w)?,
        &replicas,
        groups,
        "SGD",
        &defaults,
        ZeroOptions::default(),
    )
    .map_err(s)?;
    let check =
        |zero: &ZeroRedundancyOptimizer, expected: &Value, what: &str| -> Result<(), String> {
            let p = zero.partition().ok_or("not partitioned")?;
            let want = |key: &str| expected.get(key).cloned().unwrap_or(Value::Null);
            if p.rank_of_param != indices(&want("rank_of_param")) {
                return Err(format!(
                    "{what}: rank_of_param {:?}, expected {}",
                    p.rank_of_param,
                    want("rank_of_param")
                ));
            }
            if p.params_per_rank != nested_indices(&want("params_per_rank")) {
                return Err(format!("{what}: params_per_rank {:?}", p.params_per_rank));
            }
            let per_group: Vec<Vec<Vec<usize>>> = want("params_per_rank_per_group")
                .as_array()
                .map(|a| a.iter().map(nested_indices).collect())
                .unwrap_or_default();
            if p.params_per_rank_per_group != per_group {
                return Err(format!(
                    "{what}: params_per_rank_per_group {:?}",
                    p.params_per_rank_per_group
                ));
            }
            if p.numel_per_rank != indices(&want("numel_per_rank")) {
                return Err(format!("{what}: numel_per_rank {:?}", p.numel_per_rank));
            }
            if let Some(local) = expected
                .get("local_optimizer_param_groups")
                .and_then(Value::as_array)
            {
                let local: Vec<Vec<Vec<usize>>> = local.iter().map(nested_indices).collect();
                if local != p.params_per_rank_per_group {
                    return Err(format!(
                        "{what}: local optimizer groups differ from the partition"
                    ));
                }
            }
            Ok(())
        };
    if added.is_object() {
        check(&zero, &expected["before_add"], "before_add")?;
        let options = option_map(&added["options"]).map_err(s)?;
        zero.add_param_group_blocking(&replicas, added_range.collect(), &options)
            .map_err(s)?;
    }
    check(&zero, expected, "after")?;
    Ok(true)
}

struct Trajectory<'a> {
    case: &'a Case,
    backend: &'a Arc<dyn Backend>,
    exact: bool,
}

impl Trajectory<'_> {
    /// Steps through `grads[t][r][i]`, comparing `params_after_step`. `added` is the group to
    /// add (step, replica indices, options).
    fn run(
        &mut self,
        local: Range<usize>,
        zero: &mut ZeroRedundancyOptimizer,
        replicas: &mut Replicas,
        grads: &Value,
        expected_params: &Value,
        added: Option<(usize, Vec<usize>, serde_json::Map<String, Value>)>,
    ) -> Result<(), String> {
        let total = replicas.len();
        for (t, step) in grads.as_array().ok_or("grads")?.iter().enumerate() {
            if let Some((at, params, options)) = &added {
                if *at == t {
                    zero.add_param_group_blocking(replicas, params.clone(), options)
                        .map_err(s)?;
                }
            }
            for rank in local.clone() {
                let mut g = optional_tensors(&step[rank], &format!("grads[{t}][{rank}]"))?;
                g.resize(total, None);
                replicas.set_grads(rank - local.start, &g).map_err(s)?;
            }
            zero.step(replicas).map_err(|e| format!("step {t}: {e}"))?;
            let params = replicas.all_params_blocking().map_err(s)?;
            for (rank, p) in local.clone().zip(&params) {
                let want = &expected_params[t][rank];
                let n = want.as_array().map_or(0, Vec::len);
                self.exact &= compare_tensors(
                    self.case,
                    &p[..n],
                    want,
                    &format!("params_after_step[{t}][{rank}]"),
                )?;
            }
        }
        Ok(())
    }

    fn check_end(
        &mut self,
        world: &dyn Communicator,
        zero: &mut ZeroRedundancyOptimizer,
        replicas: &Replicas,
        expected: &Value,
    ) -> Result<(), String> {
        // A collective: every process calls it; the state dict lands on rank 0's.
        zero.consolidate_state_dict_blocking(replicas, 0)
            .map_err(s)?;
        if local_index(world, 0).is_some() {
            let sd = zero.state_dict(0).map_err(s)?;
            self.exact &= compare_json(
                self.case,
                &sd,
                &expected["consolidated_state_dict"],
                "consolidated_state_dict",
            )?;
        }
        let sizes = zero.local_state_sizes();
        if !local_sizes_match(world, &sizes, &expected["local_state_sizes"]) {
            return Err(format!(
                "local_state_sizes {sizes:?} (ranks {:?}), expected {}",
                world.local_ranks(),
                expected["local_state_sizes"]
            ));
        }
        let p = zero.partition().ok_or("partition")?;
        if p.rank_of_param != indices(&expected["rank_of_param"]) {
            return Err(format!(
                "rank_of_param {:?}, expected {}",
                p.rank_of_param, expected["rank_of_param"]
            ));
        }
        if let Some(per_rank) = expected.get("params_per_rank") {
            if p.params_per_rank != nested_indices(per_rank) {
                return Err(format!(
                    "params_per_rank {:?}, expected {per_rank}",
                    p.params_per_rank
                ));
            }
        }
        Ok(())
    }
}

/// Whether the local ranks' sizes are their entries of the expected per-rank sizes (which
/// cover the whole world).
fn local_sizes_match(world: &dyn Communicator, sizes: &[usize], expected: &Value) -> bool {
    let expected = indices(expected);
    expected.len() == world.world_size() && expected.get(world.local_ranks()) == Some(sizes)
}

fn trajectory(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let name = input["optimizer"]["name"].as_str().unwrap_or_default();
    let defaults = option_map(&input["optimizer"]["options"]).map_err(s)?;
    let mut params = tensors(&input["initial_params"], "initial_params")?;
    let mut groups: Vec<(Vec<usize>, serde_json::Map<String, Value>)> = Vec::new();
    for g in input["param_groups"].as_array().ok_or("param_groups")? {
        groups.push((
            indices(&g["param_indices"]),
            option_map(&g["options"]).map_err(s)?,
        ));
    }
    let add = &input["add_param_group_at_step"];
    let mut added = None;
    if add.is_object() {
        let first = params.len();
        params.extend(tensors(&add["initial_params"], "add.initial_params")?);
        let options = option_map(&add["options"]).map_err(s)?;
        added = Some((
            add["step"].as_u64().unwrap_or(0) as usize,
            (first..params.len()).collect::<Vec<_>>(),
            options,
        ));
    }
    let bucket = input["parameters_as_bucket_view"]
        .as_bool()
        .unwrap_or(false);
    let options = ZeroOptions {
        parameters_as_bucket_view: bucket,
        overlap_with_ddp: false,
    };
    let world = worlds(w)?;
    let local = world.local_ranks();
    let mut replicas = Replicas::replicate(backend.clone(), local.len(), &params).map_err(s)?;
    let mut zero = ZeroRedundancyOptimizer::new(
        world.clone(),
        &replicas,
        groups.clone(),
        name,
        &defaults,
        options,
    )
    .map_err(s)?;
    let mut run = Trajectory {
        case,
        backend,
        exact: true,
    };
    if let Some(before) = expected.get("rank_of_param_before_add") {
        let p = zero.partition().ok_or("partition")?;
        if p.rank_of_param != indices(before) {
            return Err(format!(
                "rank_of_param_before_add {:?}, expected {before}",
                p.rank_of_param
            ));
        }
    }
    run.run(
        local,
        &mut zero,
        &mut replicas,
        &input["grads"],
        &expected["params_after_step"],
        added.clone(),
    )?;
    run.check_end(world.as_ref(), &mut zero, &replicas, expected)?;
    let reload = &input["reload"];
    if reload.is_object() {
        let w2 = reload["world_size"].as_u64().ok_or("reload.world_size")? as usize;
        // A world of another size: one-rank-per-process worlds cannot change size, so this
        // half is reported as skipped (never as passed).
        let world2 = match worlds(w2) {
            Ok(world2) => world2,
            Err(why) => {
                super::skip_part(format!("reload into a world of {w2}: {why}"));
                return Ok(run.exact);
            }
        };
        let local2 = world2.local_ranks();
        let last = expected["params_after_step"]
            .as_array()
            .and_then(|a| a.last())
            .ok_or("params_after_step")?;
        let values = tensors(&last[0], "last params")?;
        let mut replicas =
            Replicas::replicate(run.backend.clone(), local2.len(), &values).map_err(s)?;
        let mut all_groups = groups;
        if let Some((_, params, options)) = added {
            all_groups.push((params, options));
        }
        let options = ZeroOptions {
            parameters_as_bucket_view: reload["parameters_as_bucket_view"]
                .as_bool()
                .unwrap_or(false),
            overlap_with_ddp: false,
        };
        let mut zero2 = ZeroRedundancyOptimizer::new(
            world2.clone(),
            &replicas,
            all_groups,
            name,
            &defaults,
            options,
        )
        .map_err(s)?;
        zero2
            .load_state_dict(&replicas, &expected["consolidated_state_dict"])
            .map_err(s)?;
        let want = &expected["reload"];
        let sizes = zero2.local_state_sizes();
        if !local_sizes_match(
            world2.as_ref(),
            &sizes,
            &want["local_state_sizes_after_load"],
        ) {
            return Err(format!(
                "local_state_sizes_after_load {sizes:?} (ranks {local2:?})"
            ));
        }
        run.run(
            local2,
            &mut zero2,
            &mut replicas,
            &reload["grads"],
            &want["params_after_step"],
            None,
        )?;
        run.check_end(world2.as_ref(), &mut zero2, &replicas, want)?;
    }
    Ok(run.exact)
}

/// The tensors a `zero_errors` case creates, in creation order.
#[derive(Default)]
struct Created {
    args: Vec<TensorArg>,
    shapes: Vec<Vec<usize>>,
}

impl Created {
    fn tensor(&mut self, value: &Value) -> Result<TensorArg, String> {
        if let Some(k) = value.get("ref").and_then(Value::as_u64) {
            return self
                .args
                .get(k as usize)
                .cloned()
                .ok_or_else(|| format!("ref {k} before creation"));
        }
        let dtype = DType::parse(value["dtype"].as_str().unwrap_or_default()).map_err(s)?;
        let arg = TensorArg {
            id: self.args.len(),
            dtype,
            meta: value["device"] == "meta",
            sparse: value["layout"] == "sparse_coo",
            leaf: value.get("leaf").and_then(Value::as_bool).unwrap_or(true),
        };
        self.args.push(arg.clone());
        self.shapes.push(shape_of(value));
        Ok(arg)
    }

    fn tensors(&mut self, value: &Value) -> Result<Vec<TensorArg>, String> {
        value
            .as_array()
            .ok_or("tensor list")?
            .iter()
            .map(|v| self.tensor(v))
            .collect()
    }

    fn params_arg(&mut self, params: &Value) -> Result<ParamsArg, String> {
        Ok(match params["form"].as_str().unwrap_or_default() {
            "tensor_list" => ParamsArg::List(
                self.tensors(&params["tensors"])?
                    .into_iter()
                    .map(ParamItem::Tensor)
                    .collect(),
            ),
            "param_groups" => ParamsArg::List(
                params["groups"]
                    .as_array()
                    .ok_or("groups")?
                    .iter()
                    .map(|g| {
                        let tensors = match g.get("params") {
                            Some(p) => Some(self.tensors(p)?),
                            None => None,
                        };
                        Ok(ParamItem::Group {
                            params: tensors,
                            options: option_map(&g["options"]).map_err(s)?,
                        })
                    })
                    .collect::<Result<_, String>>()?,
            ),
            "empty_list" => ParamsArg::List(Vec::new()),
            "python_floats" => ParamsArg::List(
                params["values"]
                    .as_array()
                    .map_or(0, Vec::len)
                    .pipe(|n| vec![ParamItem::Other("float".into()); n]),
            ),
            "single_tensor" => ParamsArg::Tensor(self.tensor(&params["tensor"])?),
            "python_int" => ParamsArg::NotIterable("int".into()),
            "mixed_tensor_and_group" => {
                let tensor = self.tensor(&params["tensor"])?;
                let group = self.tensors(&params["group_params"])?;
                ParamsArg::List(vec![
                    ParamItem::Tensor(tensor),
                    ParamItem::Group {
                        params: Some(group),
                        options: Default::default(),
                    },
                ])
            }
            other => return Err(format!("unknown params form {other:?}")),
        })
    }
}

trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}

fn errors(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let ctor = &input["constructor"];
    let mut created = Created::default();
    let params = created.params_arg(&ctor["params"])?;
    // The expected parameters and owners cover the constructor's tensors.
    let constructed = created.args.len();
    let calls = input["calls"].as_array().cloned().unwrap_or_default();
    // Tensors the calls create (add_param_group) exist in the model from the start.
    let mut added_ids = Vec::new();
    for call in &calls {
        if call["method"] == "add_param_group" {
            added_ids.push(created.tensors(&call["params"])?);
        }
    }
    let first_error = |error: &Error, at: &str, ranks: Vec<usize>| -> Outcome {
        if expected.get("error").is_none() {
            return Err(format!("unexpected error at {at}: {error}"));
        }
        compare_error(case, error)?;
        if expected["error_at"] != at {
            return Err(format!(
                "error at {at}, expected at {}",
                expected["error_at"]
            ));
        }
        if indices(&expected["raised_on_ranks"]) != ranks {
            return Err(format!(
                "raised on ranks {ranks:?}, expected {}",
                expected["raised_on_ranks"]
            ));
        }
        Ok(true)
    };
    let groups = match validate(&params) {
        Ok(g) => g,
        Err(e) => return first_error(&e, "constructor", (0..w).collect()),
    };
    // The model: every dense tensor created; meta and sparse ones have no data here.
    let dense: Vec<Option<usize>> = {
        let mut next = 0;
        created
            .args
            .iter()
            .map(|a| {
                (!a.meta && !a.sparse).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect()
    };
    let templates: Vec<Tensor> = created
        .args
        .iter()
        .zip(&created.shapes)
        .filter(|(a, _)| !a.meta && !a.sparse)
        .map(|(a, shape)| zero_tensor(a.dtype, shape))
        .collect();
    let mut replicas = Replicas::replicate(backend.clone(), w, &templates).map_err(s)?;
    let to_replica = |ids: &[TensorArg]| -> Result<Vec<usize>, String> {
        ids.iter()
            .map(|t| {
                dense[t.id].ok_or_else(|| "a meta or sparse tensor reached the model".to_string())
            })
            .collect()
    };
    let typed_groups: Vec<(Vec<usize>, serde_json::Map<String, Value>)> = groups
        .iter()
        .map(|(ids, options)| Ok((to_replica(ids)?, options.clone())))
        .collect::<Result<_, String>>()?;
    let options = ZeroOptions {
        parameters_as_bucket_view: ctor["parameters_as_bucket_view"].as_bool().unwrap_or(false),
        overlap_with_ddp: ctor["overlap_with_ddp"].as_bool().unwrap_or(false),
    };
    let name = ctor["optimizer"]["name"].as_str().unwrap_or_default();
    let defaults = option_map(&ctor["optimizer"]["options"]).map_err(s)?;
    let mut zero = match ZeroRedundancyOptimizer::new(
        world(w)?,
        &replicas,
        typed_groups,
        name,
        &defaults,
        options,
    ) {
        Ok(z) => z,
        Err(e) => return first_error(&e, "constructor", (0..w).collect()),
    };
    let mut first: Option<(Error, String, Vec<usize>)> = None;
    let mut added = added_ids.into_iter();
    for (k, call) in calls.iter().enumerate() {
        let at = format!("calls[{k}]");
        let mut per_rank: Vec<Result<(), Error>> = vec![Ok(()); w];
        match call["method"].as_str().unwrap_or_default() {
            "set_grads" => {
                let grads = optional_tensors(&call["grads"], "grads")?;
                let mut all = vec![None; replicas.len()];
                for (id, g) in grads.into_iter().enumerate() {
                    if let Some(Some(j)) = dense.get(id) {
                        all[*j] = g;
                    }
                }
                for rank in 0..w {
                    replicas.set_grads(rank, &all).map_err(s)?;
                }
            }
            "set_requires_grad" => {
                let id = call["param"].as_u64().unwrap_or(0) as usize;
                if let Some(Some(j)) = dense.get(id) {
                    zero.set_requires_grad(*j, call["value"].as_bool().unwrap_or(true));
                }
            }
            "state_dict" => {
                for (rank, slot) in per_rank.iter_mut().enumerate() {
                    *slot = zero.state_dict(rank).map(|_| ());
                }
            }
            "consolidate_state_dict" => {
                let to = call["to"].as_i64().unwrap_or(0);
                let result = zero.consolidate_state_dict_blocking(&replicas, to);
                per_rank = vec![result; w];
            }
            "step" => {
                let result = zero.step(&mut replicas);
                per_rank = vec![result; w];
            }
            "add_param_group" => {
                let ids = added.next().ok_or("add_param_group tensors")?;
                let result = to_replica(&ids)
                    .map_err(Error::value)
                    .and_then(|j| zero.add_param_group_blocking(&replicas, j, &Default::default()));
                per_rank = vec![result; w];
            }
            "load_state_dict" => {
                let result = zero.load_state_dict(&replicas, &call["state_dict"]);
                per_rank = vec![result; w];
            }
            other => return Err(format!("unknown call {other:?}")),
        }
        let raised: Vec<usize> = per_rank
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_err())
            .map(|(r, _)| r)
            .collect();
        if first.is_none() {
            if let Some(Err(e)) = per_rank.into_iter().find(|r| r.is_err()) {
                first = Some((e, at, raised));
            }
        }
    }
    let mut exact = true;
    match first {
        Some((e, at, ranks)) => {
            first_error(&e, &at, ranks)?;
        }
        None if expected.get("error").is_some() => {
            return Err("expected an error, none was raised".into());
        }
        None => {}
    }
    if let Some(per_rank) = expected
        .get("params_after_per_rank")
        .and_then(Value::as_array)
    {
        let params = replicas.all_params_blocking().map_err(s)?;
        for (rank, want) in per_rank.iter().enumerate() {
            let actual: Vec<Option<Tensor>> = dense[..constructed]
                .iter()
                .map(|d| d.map(|j| params[rank][j].clone()))
                .collect();
            exact &= compare_optional_tensors(
                case,
                &actual,
                want,
                &format!("params_after_per_rank[{rank}]"),
            )?;
        }
    }
    if let Some(want) = expected.get("rank_of_param") {
        let owners = zero.rank_of_replica_param(&replicas);
        let actual: Vec<Value> = dense[..constructed]
            .iter()
            .map(|d| d.and_then(|j| owners[j]).map_or(Value::Null, Value::from))
            .collect();
        if Value::Array(actual.clone()) != *want {
            return Err(format!("rank_of_param {actual:?}, expected {want}"));
        }
    }
    Ok(exact)
}

fn join(backend: &Arc<dyn Backend>, case: &Case) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let name = input["optimizer"]["name"].as_str().unwrap_or_default();
    let defaults = option_map(&input["optimizer"]["options"]).map_err(s)?;
    let initial = tensors(&input["initial_params"], "initial_params")?;
    let steps = indices(&input["steps_per_rank"]);
    let before_forward = input["zero_grad"] == "before_forward";
    let divide_by_initial = input["divide_by_initial_world_size"]
        .as_bool()
        .unwrap_or(true);
    let options = ZeroOptions {
        parameters_as_bucket_view: input["parameters_as_bucket_view"]
            .as_bool()
            .unwrap_or(false),
        overlap_with_ddp: false,
    };
    let mut replicas = Replicas::replicate(backend.clone(), w, &initial).map_err(s)?;
    let groups = vec![((0..initial.len()).collect(), Default::default())];
    let mut zero =
        ZeroRedundancyOptimizer::new(world(w)?, &replicas, groups, name, &defaults, options)
            .map_err(s)?;
    let mut exact = true;
    for (t, step) in input["grads"].as_array().ok_or("grads")?.iter().enumerate() {
        let active: Vec<usize> = (0..w).filter(|&r| steps[r] > t).collect();
        if before_forward {
            for &r in &active {
                replicas.zero_grad_rank(r);
            }
        }
        // DDP's all-reduce with the join hook: joined ranks contribute zeros; every active
        // rank gets sum_r fl32(G_r * fl32(1/D)).
        let divisor = if divide_by_initial { w } else { active.len() };
        let scale = 1.0f32 / divisor as f32;
        let mut averaged = Vec::new();
        for i in 0..initial.len() {
            let mut acc: Option<Vec<f32>> = None;
            for &r in &active {
                let g = tensor_from_json(&step[r][i], "grad").map_err(s)?;
                let values = g.values_f64().map_err(s)?;
                let scaled: Vec<f32> = values.iter().map(|&v| v as f32 * scale).collect();
                acc = Some(match acc {
                    None => scaled,
                    Some(a) => a.iter().zip(&scaled).map(|(x, y)| x + y).collect(),
                });
            }
            let values: Vec<f64> = acc.unwrap_or_default().into_iter().map(f64::from).collect();
            averaged.push(Some(
                Tensor::from_f64(initial[i].dtype(), initial[i].shape(), &values).map_err(s)?,
            ));
        }
        for &r in &active {
            replicas.set_grads(r, &averaged).map_err(s)?;
        }
        let grads = replicas.all_grads_blocking().map_err(s)?;
        for &r in &active {
            exact &= compare_optional_tensors(
                case,
                &grads[r],
                &expected["grads_after_backward"][t][r],
                &format!("grads_after_backward[{t}][{r}]"),
            )?;
        }
        // Active ranks step; joined ranks run ZeRO's join hook, which steps too.
        zero.join_hook().main_hook(&mut replicas).map_err(s)?;
        if !before_forward {
            for &r in &active {
                replicas.zero_grad_rank(r);
            }
        }
        let params = replicas.all_params_blocking().map_err(s)?;
        for &r in &active {
            exact &= compare_tensors(
                case,
                &params[r],
                &expected["params_after_step"][t][r],
                &format!("params_after_step[{t}][{r}]"),
            )?;
        }
    }
    let params = replicas.all_params_blocking().map_err(s)?;
    let grads = replicas.all_grads_blocking().map_err(s)?;
    for r in 0..w {
        exact &= compare_tensors(
            case,
            &params[r],
            &expected["params_after_join"][r],
            &format!("params_after_join[{r}]"),
        )?;
        exact &= compare_optional_tensors(
            case,
            &grads[r],
            &expected["grads_after_join"][r],
            &format!("grads_after_join[{r}]"),
        )?;
    }
    if zero.local_state_sizes() != indices(&expected["local_state_sizes"]) {
        return Err(format!(
            "local_state_sizes {:?}, expected {}",
            zero.local_state_sizes(),
            expected["local_state_sizes"]
        ));
    }
    if let Some(want) = expected.get("rank_of_param") {
        let p = zero.partition().ok_or("partition")?;
        if p.rank_of_param != indices(want) {
            return Err(format!(
                "rank_of_param {:?}, expected {want}",
                p.rank_of_param
            ));
        }
    }
    Ok(exact)
}
