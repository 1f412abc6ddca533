//! The `params` argument as a dynamic front end (Python, JavaScript, JSON) passes it, and
//! PyTorch's checks of it (`_verify_and_init_params`, `_verify_same_dense_param_type`,
//! `Optimizer.add_param_group`), with PyTorch's error texts.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::optim::OptionMap;

/// A tensor as the checks see it. Tensors with the same `id` are the same object.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorArg {
    /// Identity: the same id is the same tensor (a parameter passed twice).
    pub id: usize,
    /// Element type.
    pub dtype: DType,
    /// On the `meta` device (no data).
    pub meta: bool,
    /// A sparse COO tensor.
    pub sparse: bool,
    /// A leaf tensor (not the result of an operation).
    pub leaf: bool,
}

impl TensorArg {
    /// `torch.typename(tensor)`, e.g. `torch.FloatTensor`, `torch.sparse.FloatTensor`.
    pub fn typename(&self) -> String {
        let base = match self.dtype {
            DType::Float32 => "FloatTensor",
            DType::Float64 => "DoubleTensor",
            DType::Float16 => "HalfTensor",
            DType::BFloat16 => "BFloat16Tensor",
        };
        let prefix = if self.sparse {
            "torch.sparse."
        } else if self.meta {
            "torch.meta."
        } else {
            "torch."
        };
        format!("{prefix}{base}")
    }
}

/// PyTorch's `_verify_same_dense_param_type` error for dense parameters of two dtypes.
pub(crate) fn mixed_dense_types(first: DType, other: DType) -> Error {
    let name = |dtype| {
        TensorArg {
            id: 0,
            dtype,
            meta: false,
            sparse: false,
            leaf: true,
        }
        .typename()
    };
    Error::value(format!(
        "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got both {} and {}",
        name(first),
        name(other)
    ))
}

/// One item of a `params` list.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamItem {
    /// A tensor.
    Tensor(TensorArg),
    /// A parameter group dict; `params` is `None` when the dict has no `"params"` key.
    Group {
        /// The group's tensors.
        params: Option<Vec<TensorArg>>,
        /// The group's own options.
        options: OptionMap,
    },
    /// Anything else, by its Python type name (`float`, `str`, …).
    Other(String),
}

/// The `params` argument.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamsArg {
    /// A single tensor (not an iterable of them).
    Tensor(TensorArg),
    /// A non-iterable value, by its Python type name (`int`, …).
    NotIterable(String),
    /// A list.
    List(Vec<ParamItem>),
}

/// The message of a duplicate parameter within one group.
pub use crate::optim::DUPLICATE_WARNING;

/// Runs PyTorch's checks and returns the parameter groups as tensor ids with their options.
///
/// # Errors
/// PyTorch's, in its order: a `TypeError` when `params` is a single tensor, not iterable, or a list
/// that mixes tensors and dicts (or holds anything else); a `ValueError` for an empty list, a group
/// dict without `"params"`, a sparse tensor or tensors of different types, a non-leaf tensor, or a
/// tensor in more than one group.
pub fn validate(params: &ParamsArg) -> Result<Vec<(Vec<TensorArg>, OptionMap)>> {
    let items = match params {
        ParamsArg::Tensor(t) => {
            return Err(Error::type_error(format!(
                "`params` argument should be an iterable of Tensors, but got {}",
                t.typename()
            )));
        }
        ParamsArg::NotIterable(typename) => {
            return Err(Error::type_error(format!(
                "`params` argument should be an iterable of Tensors or dicts, but got {typename}"
            )));
        }
        ParamsArg::List(items) => items,
    };
    if items.is_empty() {
        return Err(Error::value(
            "ZeroRedundancyOptimizer got an empty parameter list",
        ));
    }
    let all_tensors = items.iter().all(|i| matches!(i, ParamItem::Tensor(_)));
    let all_dicts = items.iter().all(|i| matches!(i, ParamItem::Group { .. }));
    if !all_tensors && !all_dicts {
        return Err(Error::type_error(
            "`params` argument should be an iterable of Tensors or dicts",
        ));
    }
    let groups: Vec<(Vec<TensorArg>, OptionMap)> = if all_tensors {
        let tensors = items
            .iter()
            .filter_map(|i| match i {
                ParamItem::Tensor(t) => Some(t.clone()),
                _ => None,
            })
            .collect();
        vec![(tensors, OptionMap::new())]
    } else {
        let mut groups = Vec::new();
        for item in items {
            if let ParamItem::Group { params, options } = item {
                let params = params.clone().ok_or_else(|| {
                    Error::value(
                        "Each parameter group passed-in via `params` must have a 'params' key mapping to the parameters in the group",
                    )
                })?;
                groups.push((params, options.clone()));
            }
        }
        groups
    };
    // `_verify_same_dense_param_type`, over every parameter of every group.
    let all: Vec<&TensorArg> = groups.iter().flat_map(|(g, _)| g).collect();
    if let Some(first) = all.first() {
        let typename = first.typename();
        if first.sparse {
            return Err(Error::value(format!(
                "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got {typename}"
            )));
        }
        for other in &all[1..] {
            let other = other.typename();
            if other != typename {
                return Err(Error::value(format!(
                    "ZeroRedundancyOptimizer only supports using the same dense type for all parameters but got both {typename} and {other}"
                )));
            }
        }
    }
    // `Optimizer.add_param_group`, group by group.
    let mut seen: Vec<usize> = Vec::new();
    for (tensors, _) in &groups {
        if tensors.iter().any(|t| !t.leaf) {
            return Err(Error::value("can't optimize a non-leaf Tensor"));
        }
        let mut ids: Vec<usize> = tensors.iter().map(|t| t.id).collect();
        ids.sort_unstable();
        let before = ids.len();
        ids.dedup();
        if ids.len() != before {
            crate::warnings::warn(DUPLICATE_WARNING);
        }
        if ids.iter().any(|id| seen.contains(id)) {
            return Err(Error::value(
                "some parameters appear in more than one parameter group",
            ));
        }
        seen.extend(ids);
    }
    Ok(groups)
}
