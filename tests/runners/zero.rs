//! The `zero_*` kinds: partition, trajectories (with reloads into other world sizes), errors
//! and warnings, and the join hook with uneven inputs.

use std::ops::Range;
use std::sync::Arc;

use distopt::BlockOn;
use distopt::comm::{Communicator, SimulatedWorld, local_index};
use distopt::ddp::DistributedDataParallel;
use distopt::join::{Join, JoinOptions, Joinable};
use distopt::optim::option_map;
use distopt::replicas::Replicas;
use distopt::warnings::Warning;
use distopt::zero::args::{ParamItem, ParamsArg, TensorArg};
use distopt::zero::{ZeroOptions, ZeroRedundancyOptimizer};
use distopt::{Backend, DType, Error, RankErrors, Tensor, warnings};
use serde_json::Value;

use super::{
    Outcome, WorldFactory, compare_json, compare_optional_tensors, compare_tensors,
    compare_warnings, optional_tensors, tensors,
};
use crate::common::{Case, compare_error};

/// An error as text: a per-rank error is its lowest local rank's.
fn s(e: impl Into<Error>) -> String {
    e.into().to_string()
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

/// Runs a `zero_*` case. `zero_trajectory`, `zero_errors` and `zero_join` run on the worlds
/// `worlds` builds, over this process's ranks only; `zero_partition` always runs on the
/// simulated world.
pub fn run_with_world(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    warnings::take();
    let outcome = match case.kind.as_str() {
        "zero_partition" => partition(backend, case),
        "zero_trajectory" => trajectory(backend, case, worlds),
        "zero_errors" => errors(backend, case, worlds),
        "zero_join" => join(backend, case, worlds),
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
            if let Some(want) = expected
                .get("local_optimizer_param_groups")
                .and_then(Value::as_array)
            {
                // Read from each rank's local optimizer, not from the partition.
                let want: Vec<Vec<Vec<usize>>> = want.iter().map(nested_indices).collect();
                let local = zero
                    .local_optimizer_param_groups()
                    .ok_or("no local optimizers")?;
                if local != want {
                    return Err(format!(
                        "{what}: local_optimizer_param_groups {local:?}, expected {want:?}"
                    ));
                }
            }
            Ok(())
        };
    if added.is_object() {
        check(&zero, &expected["before_add"], "before_add")?;
        let options = option_map(&added["options"]).map_err(s)?;
        zero.add_param_group(&replicas, added_range.collect(), &options)
            .block_on()
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
                    zero.add_param_group(replicas, params.clone(), options)
                        .block_on()
                        .map_err(s)?;
                }
            }
            for rank in local.clone() {
                let mut g = optional_tensors(&step[rank], &format!("grads[{t}][{rank}]"))?;
                g.resize(total, None);
                replicas.set_grads(rank - local.start, &g).map_err(s)?;
            }
            zero.step(replicas).map_err(|e| format!("step {t}: {e}"))?;
            let params = replicas.all_params().block_on().map_err(s)?;
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
        zero.consolidate_state_dict(replicas, 0)
            .block_on()
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
    let options = ZeroOptions::default()
        .with_parameters_as_bucket_view(bucket)
        .with_overlap_with_ddp(false);
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
        let options = ZeroOptions::default()
            .with_parameters_as_bucket_view(
                reload["parameters_as_bucket_view"]
                    .as_bool()
                    .unwrap_or(false),
            )
            .with_overlap_with_ddp(false);
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

/// One stage of a `zero_errors` case (the constructor, or a call that is not set-up): each
/// local rank's error, if it raised, and the warnings each local rank emitted meanwhile.
struct Stage {
    name: String,
    errors: Vec<Option<Error>>,
    warnings: Vec<Vec<String>>,
}

/// The warnings recorded since `mark`, per local rank (a record names the ranks that emitted
/// it).
fn warnings_since(mark: usize, local: &Range<usize>) -> Vec<Vec<String>> {
    let records = warnings::recorded_records();
    local
        .clone()
        .map(|rank| {
            records[mark.min(records.len())..]
                .iter()
                .filter(|w| w.emitted_by(rank))
                .map(|w| w.message.clone())
                .collect()
        })
        .collect()
}

/// Each local rank's error from a call every local rank made.
fn rank_outcomes<T>(local: &Range<usize>, result: Result<T, RankErrors>) -> Vec<Option<Error>> {
    match result {
        Ok(_) => vec![None; local.len()],
        Err(errors) => local.clone().map(|r| errors.get(r).cloned()).collect(),
    }
}

/// Compares the stages with `expected.stages` (local ranks only: a process sees its own), then
/// the first error with `error`, `error_at` and `raised_on_ranks`.
fn compare_stages(case: &Case, local: &Range<usize>, stages: &[Stage]) -> Result<(), String> {
    let expected = case.expected();
    let want = expected["stages"].as_array().ok_or("expected.stages")?;
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    let want_names: Vec<&str> = want.iter().filter_map(|s| s["stage"].as_str()).collect();
    if names != want_names {
        return Err(format!("stages {names:?}, expected {want_names:?}"));
    }
    for (stage, want) in stages.iter().zip(want) {
        let what = &stage.name;
        for (i, rank) in local.clone().enumerate() {
            let outcome = want["outcome_per_rank"][rank].as_str().unwrap_or_default();
            match (&stage.errors[i], outcome) {
                (None, "ok") => {
                    if !want["messages_per_rank"].is_null()
                        && !want["messages_per_rank"][rank].is_null()
                    {
                        return Err(format!("{what}: rank {rank} has a message but no error"));
                    }
                }
                (Some(e), "error") => {
                    // Where PyTorch's ranks raised different classes, each rank's
                    // (`error_types_per_rank`, written by scripts/torch-fuzz-gloo.py).
                    let want_type = want
                        .get("error_types_per_rank")
                        .map_or(&want["error_type"], |types| &types[rank]);
                    if e.kind().name() != want_type {
                        return Err(format!(
                            "{what}: rank {rank} raised {}, expected {want_type}",
                            e.kind().name(),
                        ));
                    }
                    if e.message() != want["messages_per_rank"][rank] {
                        return Err(format!(
                            "{what}: rank {rank}'s message {:?}, expected {}",
                            e.message(),
                            want["messages_per_rank"][rank]
                        ));
                    }
                }
                (got, outcome) => {
                    return Err(format!(
                        "{what}: rank {rank} {}, expected {outcome}",
                        got.as_ref()
                            .map_or("succeeded".to_string(), |e| format!("raised {e}"))
                    ));
                }
            }
            let texts: Vec<&str> = want["warnings_per_rank"][rank]
                .as_array()
                .ok_or_else(|| format!("{what}: warnings_per_rank[{rank}]"))?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let got = &stage.warnings[i];
            if got.len() != texts.len() || !got.iter().zip(&texts).all(|(g, t)| g.contains(t)) {
                return Err(format!(
                    "{what}: rank {rank} warned {got:?}, expected {texts:?}"
                ));
            }
        }
    }
    // The first error, on the ranks that raised it.
    let first = stages.iter().find(|s| s.errors.iter().any(Option::is_some));
    match (first, expected.get("error")) {
        (None, None) => Ok(()),
        (None, Some(_))
            if local.clone().all(|r| {
                // A process that holds none of the raising ranks sees no error.
                !indices(&expected["raised_on_ranks"]).contains(&r)
            }) =>
        {
            Ok(())
        }
        (None, Some(_)) => Err("expected an error, none was raised".into()),
        (Some(stage), None) => Err(format!("unexpected error at {}", stage.name)),
        (Some(stage), Some(_)) => {
            let error = stage.errors.iter().flatten().next().ok_or("no error")?;
            // With a class per rank, `error` is the lowest raising rank's, which this process
            // may not hold; the stage's comparison has checked every rank's class and text.
            let per_rank_types = want
                .iter()
                .find(|w| w["stage"] == stage.name.as_str())
                .is_some_and(|w| w.get("error_types_per_rank").is_some());
            if !per_rank_types {
                compare_error(case, error)?;
            }
            if expected["error_at"] != stage.name.as_str() {
                return Err(format!(
                    "error at {}, expected at {}",
                    stage.name, expected["error_at"]
                ));
            }
            let raised: Vec<usize> = local
                .clone()
                .zip(&stage.errors)
                .filter(|(_, e)| e.is_some())
                .map(|(r, _)| r)
                .collect();
            let want: Vec<usize> = indices(&expected["raised_on_ranks"])
                .into_iter()
                .filter(|r| local.contains(r))
                .collect();
            if raised != want {
                return Err(format!(
                    "raised on ranks {raised:?}, expected {} (this process holds {local:?})",
                    expected["raised_on_ranks"]
                ));
            }
            Ok(())
        }
    }
}

/// Compares every distinct warning emitted with `expected.warning_details`: the same channel
/// and category for each expected text, and no other warning.
fn compare_warning_details(case: &Case, records: &[Warning]) -> Result<(), String> {
    let want = case.expected()["warning_details"]
        .as_array()
        .ok_or("expected.warning_details")?;
    let matches = |w: &Warning, d: &Value| {
        d["channel"] == w.channel.name()
            && d["category"] == w.category.as_str()
            && w.message.contains(d["message"].as_str().unwrap_or("\u{0}"))
    };
    for d in want {
        if !records.iter().any(|w| matches(w, d)) {
            return Err(format!(
                "no {} {} warning {}; emitted {:?}",
                d["channel"],
                d["category"],
                d["message"],
                records.iter().map(|w| w.to_string()).collect::<Vec<_>>()
            ));
        }
    }
    if let Some(w) = records.iter().find(|w| !want.iter().any(|d| matches(w, d))) {
        return Err(format!("unexpected warning {w}"));
    }
    Ok(())
}

fn errors(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let world = worlds(w)?;
    let local = world.local_ranks();
    let first_record = warnings::recorded_records().len();
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
    let mut replicas = Replicas::replicate(backend.clone(), local.len(), &templates).map_err(s)?;
    let to_replica = |ids: &[TensorArg]| -> Result<Vec<usize>, String> {
        ids.iter()
            .map(|t| {
                dense[t.id].ok_or_else(|| "a meta or sparse tensor reached the model".to_string())
            })
            .collect()
    };
    let options = ZeroOptions::default()
        .with_parameters_as_bucket_view(
            ctor["parameters_as_bucket_view"].as_bool().unwrap_or(false),
        )
        .with_overlap_with_ddp(ctor["overlap_with_ddp"].as_bool().unwrap_or(false));
    let name = ctor["optimizer"]["name"].as_str().unwrap_or_default();
    let defaults = option_map(&ctor["optimizer"]["options"]).map_err(s)?;
    let mut stages = Vec::new();
    let mark = warnings::recorded_records().len();
    let constructed_zero = ZeroRedundancyOptimizer::from_params(
        world.clone(),
        &replicas,
        &params,
        &|t: &TensorArg| dense.get(t.id).copied().flatten(),
        name,
        &defaults,
        options,
    );
    stages.push(Stage {
        name: "constructor".into(),
        errors: rank_outcomes(
            &local,
            constructed_zero.as_ref().map(|_| ()).map_err(Clone::clone),
        ),
        warnings: warnings_since(mark, &local),
    });
    let mut zero = constructed_zero.ok();
    let mut added = added_ids.into_iter();
    if let Some(zero) = zero.as_mut() {
        for (k, call) in calls.iter().enumerate() {
            let mark = warnings::recorded_records().len();
            let errors = match call["method"].as_str().unwrap_or_default() {
                "set_grads" => {
                    let grads = optional_tensors(&call["grads"], "grads")?;
                    let mut all = vec![None; replicas.len()];
                    for (id, g) in grads.into_iter().enumerate() {
                        if let Some(Some(j)) = dense.get(id) {
                            all[*j] = g;
                        }
                    }
                    // Every rank sets its own tensors' gradients.
                    for index in 0..local.len() {
                        replicas.set_grads(index, &all).map_err(s)?;
                    }
                    continue;
                }
                "set_requires_grad" => {
                    let id = call["param"].as_u64().unwrap_or(0) as usize;
                    if let Some(Some(j)) = dense.get(id) {
                        zero.set_requires_grad(*j, call["value"].as_bool().unwrap_or(true));
                    }
                    continue;
                }
                "state_dict" => zero
                    .state_dict_on_ranks()
                    .into_iter()
                    .map(|(_, r)| r.err())
                    .collect(),
                "consolidate_state_dict" => {
                    let to = call["to"].as_i64().unwrap_or(0);
                    rank_outcomes(
                        &local,
                        zero.consolidate_state_dict(&replicas, to).block_on(),
                    )
                }
                "step" => rank_outcomes(&local, zero.step(&mut replicas)),
                "add_param_group" => {
                    let ids = added.next().ok_or("add_param_group tensors")?;
                    let j = to_replica(&ids)?;
                    rank_outcomes(
                        &local,
                        zero.add_param_group(&replicas, j, &Default::default())
                            .block_on(),
                    )
                }
                "load_state_dict" => {
                    rank_outcomes(&local, zero.load_state_dict(&replicas, &call["state_dict"]))
                }
                other => return Err(format!("unknown call {other:?}")),
            };
            stages.push(Stage {
                name: format!("calls[{k}]"),
                errors,
                warnings: warnings_since(mark, &local),
            });
        }
    }
    compare_stages(case, &local, &stages)?;
    let records = warnings::recorded_records();
    compare_warning_details(case, &records[first_record.min(records.len())..])?;
    let mut exact = true;
    let Some(zero) = zero else {
        return Ok(exact);
    };
    if let Some(per_rank) = expected
        .get("params_after_per_rank")
        .and_then(Value::as_array)
    {
        let params = replicas.all_params().block_on().map_err(s)?;
        for (index, rank) in local.clone().enumerate() {
            let actual: Vec<Option<Tensor>> = dense[..constructed]
                .iter()
                .map(|d| d.map(|j| params[index][j].clone()))
                .collect();
            exact &= compare_optional_tensors(
                case,
                &actual,
                &per_rank[rank],
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

/// `Join([ddp, zero])` with uneven inputs: the runner feeds each rank's local gradients while
/// it has inputs and tells the context which ranks still have them; DDP's all-reduce, the
/// joined ranks' hooks and the final broadcast are the library's.
fn join(backend: &Arc<dyn Backend>, case: &Case, worlds: WorldFactory) -> Outcome {
    let (input, expected) = (case.input(), case.expected());
    let w = input["world_size"].as_u64().ok_or("world_size")? as usize;
    let world = worlds(w)?;
    let local = world.local_ranks();
    let name = input["optimizer"]["name"].as_str().unwrap_or_default();
    let defaults = option_map(&input["optimizer"]["options"]).map_err(s)?;
    let initial = tensors(&input["initial_params"], "initial_params")?;
    let steps = indices(&input["steps_per_rank"]);
    if steps.len() != w {
        return Err(format!(
            "steps_per_rank has {} entries for {w} ranks",
            steps.len()
        ));
    }
    let before_forward = match input["zero_grad"].as_str() {
        Some("before_forward") => true,
        Some("after_step") => false,
        other => return Err(format!("unknown zero_grad {other:?}")),
    };
    let join_options = JoinOptions::default().with_divide_by_initial_world_size(
        input["divide_by_initial_world_size"]
            .as_bool()
            .ok_or("divide_by_initial_world_size")?,
    );
    let options = ZeroOptions::default()
        .with_parameters_as_bucket_view(
            input["parameters_as_bucket_view"]
                .as_bool()
                .unwrap_or(false),
        )
        .with_overlap_with_ddp(false);
    let mut replicas = Replicas::replicate(backend.clone(), local.len(), &initial).map_err(s)?;
    let mut ddp = DistributedDataParallel::new(world.clone(), &mut replicas).map_err(s)?;
    let groups = vec![((0..initial.len()).collect(), Default::default())];
    let mut zero =
        ZeroRedundancyOptimizer::new(world.clone(), &replicas, groups, name, &defaults, options)
            .map_err(s)?;
    let mut join = Join::new(
        &mut [&mut ddp as &mut dyn Joinable, &mut zero],
        join_options,
    )
    .map_err(s)?;
    let mut exact = true;
    let grads = input["grads"].as_array().ok_or("grads")?;
    // This process's ranks train while one of them has inputs; the others' shadow iterations
    // (other processes') are run by `exit`.
    let iterations = local.clone().map(|r| steps[r]).max().unwrap_or(0);
    for (t, step) in grads.iter().enumerate().take(iterations) {
        let has_input: Vec<bool> = local.clone().map(|r| steps[r] > t).collect();
        join.iteration(&has_input).map_err(s)?;
        for (index, rank) in local.clone().enumerate().filter(|&(i, _)| has_input[i]) {
            if before_forward {
                replicas.zero_grad_rank(index);
            }
            // The rank's backward pass: its local gradients.
            let g = optional_tensors(&step[rank], &format!("grads[{t}][{rank}]"))?;
            replicas.set_grads(index, &g).map_err(s)?;
        }
        ddp.synchronize_gradients(&mut replicas)
            .map_err(|e| format!("iteration {t}: {e}"))?;
        let after_backward = replicas.all_grads().block_on().map_err(s)?;
        for (index, rank) in local.clone().enumerate().filter(|&(i, _)| has_input[i]) {
            exact &= compare_optional_tensors(
                case,
                &after_backward[index],
                &expected["grads_after_backward"][t][rank],
                &format!("grads_after_backward[{t}][{rank}]"),
            )?;
        }
        zero.step(&mut replicas)
            .map_err(|e| format!("iteration {t}: {e}"))?;
        if !before_forward {
            for index in (0..local.len()).filter(|&i| has_input[i]) {
                replicas.zero_grad_rank(index);
            }
        }
        let params = replicas.all_params().block_on().map_err(s)?;
        for (index, rank) in local.clone().enumerate().filter(|&(i, _)| has_input[i]) {
            exact &= compare_tensors(
                case,
                &params[index],
                &expected["params_after_step"][t][rank],
                &format!("params_after_step[{t}][{rank}]"),
            )?;
        }
    }
    join.exit(
        &mut [&mut ddp as &mut dyn Joinable, &mut zero],
        &mut replicas,
    )
    .map_err(|e| format!("exit: {e}"))?;
    let params = replicas.all_params().block_on().map_err(s)?;
    let grads = replicas.all_grads().block_on().map_err(s)?;
    for (index, rank) in local.clone().enumerate() {
        exact &= compare_tensors(
            case,
            &params[index],
            &expected["params_after_join"][rank],
            &format!("params_after_join[{rank}]"),
        )?;
        exact &= compare_optional_tensors(
            case,
            &grads[index],
            &expected["grads_after_join"][rank],
            &format!("grads_after_join[{rank}]"),
        )?;
    }
    let sizes = zero.local_state_sizes();
    if !local_sizes_match(world.as_ref(), &sizes, &expected["local_state_sizes"]) {
        return Err(format!(
            "local_state_sizes {sizes:?} (ranks {local:?}), expected {}",
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
    Ok(exact)
}
