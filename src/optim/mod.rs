//! Local optimizers over replica arenas: `torch.optim.SGD`, `Adam` and `AdamW`, one fused
//! dispatch per step per dtype for every rank and parameter, with PyTorch's defaults,
//! constructor errors, parameter groups and `state_dict()` layout.
//!
//! Every rank has its own optimizer state (as every process has its own optimizer in PyTorch);
//! state dicts are per rank.

mod adam;
mod options;
mod sgd;

pub use adam::{Adam, AdamOptions};
pub use options::{OptionMap, option_map};
pub use sgd::{Sgd, SgdOptions};

use serde_json::Value;

use crate::backend::BoxFuture;
use crate::error::{Error, Result};
use crate::replicas::Replicas;

/// What every local optimizer offers (PyTorch's `Optimizer` surface).
pub trait LocalOptimizer: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// `"SGD"`, `"Adam"` or `"AdamW"`.
    fn name(&self) -> &'static str;

    /// One step on every rank: each parameter with a gradient on a rank is updated from it;
    /// parameters without one are skipped, their state untouched.
    fn step(&mut self, replicas: &mut Replicas) -> Result<()>;

    /// The global parameter indices of each parameter group.
    fn param_groups(&self) -> Vec<Vec<usize>>;

    /// Every group's options, complete (defaults filled in), as `state_dict()` lists them.
    fn group_options(&self) -> Vec<OptionMap>;

    /// Adds a group of parameters with its own options (others from the defaults).
    fn add_param_group(&mut self, params: Vec<usize>, options: &OptionMap) -> Result<()>;

    /// `optimizer.state_dict()` of rank `rank`, in PyTorch's layout.
    fn state_dict<'a>(
        &'a self,
        replicas: &'a Replicas,
        rank: usize,
    ) -> BoxFuture<'a, Result<Value>>;

    /// `optimizer.load_state_dict(state_dict)` on rank `rank`.
    fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()>;

    /// Bytes of optimizer state allocated per rank.
    fn state_bytes_per_rank(&self) -> usize;

    /// How many parameters have non-empty state on rank `rank` (`len(optimizer.state)`).
    fn state_len(&self, rank: usize) -> usize;

    /// `zero_grad(set_to_none=True)`.
    fn zero_grad(&self, replicas: &mut Replicas) {
        replicas.zero_grad();
    }
}

/// Builds the optimizer named `name` (`"SGD"`, `"Adam"`, `"AdamW"`) over `groups` of global
/// parameter indices, each with its own options over `defaults`.
pub fn create(
    name: &str,
    replicas: &Replicas,
    groups: Vec<(Vec<usize>, OptionMap)>,
    defaults: &OptionMap,
) -> Result<Box<dyn LocalOptimizer>> {
    Ok(match name {
        "SGD" => Box::new(Sgd::from_options(replicas, groups, defaults)?),
        "Adam" => Box::new(Adam::from_options(replicas, groups, defaults, false)?),
        "AdamW" => Box::new(Adam::from_options(replicas, groups, defaults, true)?),
        other => {
            return Err(Error::value(format!(
                "unknown optimizer '{other}': expected SGD, Adam or AdamW"
            )));
        }
    })
}

/// A `ValueError` unless `replicas` has the ranks and parameters an optimizer was built for.
pub(crate) fn check_same_model(replicas: &Replicas, ranks: usize, params: usize) -> Result<()> {
    if replicas.ranks() != ranks || replicas.len() != params {
        return Err(Error::value(format!(
            "this optimizer was built for {ranks} ranks of {params} parameters, not {} ranks of {}",
            replicas.ranks(),
            replicas.len()
        )));
    }
    Ok(())
}

/// Checks that every index of `groups` names a parameter of `replicas` and appears once.
pub(crate) fn check_groups(replicas: &Replicas, groups: &[Vec<usize>]) -> Result<()> {
    let mut seen = vec![false; replicas.len()];
    for group in groups {
        for &j in group {
            if j >= replicas.len() {
                return Err(Error::new(
                    crate::ErrorKind::IndexError,
                    format!(
                        "parameter index {j} out of range for {} parameters",
                        replicas.len()
                    ),
                ));
            }
            if seen[j] {
                return Err(Error::value(
                    "some parameters appear in more than one parameter group",
                ));
            }
            seen[j] = true;
        }
    }
    Ok(())
}

/// The optimizer-local index of each global parameter (its position in the groups' order),
/// as PyTorch numbers `state_dict()["state"]`.
pub(crate) fn local_indices(groups: &[Vec<usize>], params: usize) -> Vec<Option<usize>> {
    let mut out = vec![None; params];
    for (k, &j) in groups.iter().flatten().enumerate() {
        out[j] = Some(k);
    }
    out
}

/// Rank `rank`'s slice of parameter `j` in a state arena (laid out like the parameters).
pub(crate) async fn read_state(
    arena: &crate::backend::Arena,
    replicas: &Replicas,
    rank: usize,
    j: usize,
) -> Result<crate::Tensor> {
    let slot = &replicas.slots[j];
    let words = arena.read_range(rank, slot.offset, slot.numel).await?;
    crate::Tensor::new(
        &slot.shape,
        crate::HostData::decode(slot.dtype, arena.format(), &words, slot.numel),
    )
}

/// Writes a loaded state tensor into rank `rank`'s slice of a state arena, cast to the
/// parameter's dtype (as PyTorch's `load_state_dict` casts state to its parameter's dtype).
pub(crate) fn write_state(
    arena: &mut crate::backend::Arena,
    slot: &crate::replicas::ParamSlot,
    rank: usize,
    tensor: &crate::Tensor,
) -> Result<()> {
    if tensor.numel() != slot.numel {
        return Err(Error::value(format!(
            "loaded state of shape {} does not fit a parameter of shape {}",
            crate::tensor::format_shape(tensor.shape()),
            crate::tensor::format_shape(&slot.shape)
        )));
    }
    let data = tensor
        .host_data()
        .ok_or_else(|| Error::value("loaded state must be a host tensor"))?;
    let mut words = vec![0u32; arena.format().words_for(slot.numel)];
    data.encode_into(arena.format(), &mut words);
    arena.write(rank, slot.offset, &words)
}

/// `state_dict()["param_groups"]`: every group's options plus `params`, the optimizer-local
/// indices (numbered across the groups in order).
pub(crate) fn param_groups_json(groups: &[(Vec<usize>, OptionMap)]) -> Vec<Value> {
    let mut next = 0;
    groups
        .iter()
        .map(|(params, options)| {
            let mut group = options.clone();
            group.insert(
                "params".into(),
                Value::from((next..next + params.len()).collect::<Vec<_>>()),
            );
            next += params.len();
            Value::Object(group)
        })
        .collect()
}

/// `load_state_dict`: the saved groups' hyper-parameters replace ours (the parameters stay).
pub(crate) fn apply_loaded_options(groups: &mut [(Vec<usize>, OptionMap)], saved: Vec<Value>) {
    for ((_, options), saved) in groups.iter_mut().zip(saved) {
        if let Value::Object(saved) = saved {
            for (key, value) in saved {
                if key != "params" {
                    options.insert(key, value);
                }
            }
        }
    }
}

/// Validates that a loaded state dict's groups match ours, as PyTorch does.
pub(crate) fn check_loaded_groups(ours: &[Vec<usize>], state_dict: &Value) -> Result<Vec<Value>> {
    let groups = state_dict
        .get("param_groups")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::value("state dict has no \"param_groups\" list"))?;
    if groups.len() != ours.len() {
        return Err(Error::value(
            "loaded state dict has a different number of parameter groups",
        ));
    }
    for (group, mine) in groups.iter().zip(ours) {
        let len = group
            .get("params")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if len != mine.len() {
            return Err(Error::value(
                "loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
            ));
        }
    }
    Ok(groups.clone())
}
