//! [`LocalOptimizer`]: what every local optimizer offers (PyTorch's `Optimizer` surface).

use serde_json::Value;

use super::kind::OptimizerKind;
use super::options::OptionMap;
use crate::backend::BoxFuture;
use crate::error::{Error, Result};
use crate::replicas::Replicas;

/// What every local optimizer offers (PyTorch's `Optimizer` surface).
pub trait LocalOptimizer: crate::backend::MaybeSendSync + std::fmt::Debug {
    /// `"SGD"`, `"Adam"` or `"AdamW"`.
    fn name(&self) -> &'static str;

    /// The optimizer's class.
    fn kind(&self) -> OptimizerKind;

    /// One step on every rank: each parameter with a gradient on a rank is updated from it;
    /// parameters without one are skipped, their state untouched.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than the optimizer was built
    /// for; a `RuntimeError` when a state arena does not fit the memory budget or the backend fails
    /// (a GPU error, a lost device).
    fn step(&mut self, replicas: &mut Replicas) -> Result<()>;

    /// Checks, changing nothing, that `replicas` has the ranks and parameters this optimizer
    /// was built for (the first check of [`LocalOptimizer::step`]); the default accepts any.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than the optimizer was built
    /// for.
    fn check_model(&self, replicas: &Replicas) -> Result<()> {
        let _ = replicas;
        Ok(())
    }

    /// The global parameter indices of each parameter group.
    fn param_groups(&self) -> Vec<Vec<usize>>;

    /// Every group's options, complete (defaults filled in), as `state_dict()` lists them.
    fn group_options(&self) -> Vec<OptionMap>;

    /// Adds a group of parameters with its own options (others from the defaults).
    ///
    /// # Errors
    /// PyTorch's, with nothing changed: an `IndexError` for an index outside the replicas, a
    /// `TypeError` for an unknown keyword or an option of the wrong type, a `ValueError` for a
    /// parameter another group holds. The group's values are not range-checked: as in PyTorch, only
    /// the constructor's defaults are.
    fn add_param_group(&mut self, params: Vec<usize>, options: &OptionMap) -> Result<()>;

    /// `optimizer.state_dict()` of rank `rank`, in PyTorch's layout.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than the optimizer was built
    /// for; an `IndexError` when `rank` is out of range; a `RuntimeError` when a state readback
    /// fails (a GPU error, a lost device).
    fn state_dict<'a>(
        &'a self,
        replicas: &'a Replicas,
        rank: usize,
    ) -> BoxFuture<'a, Result<Value>>;

    /// Checks that [`LocalOptimizer::load_state_dict`] would accept `state_dict`, changing
    /// nothing (so that a caller loading several optimizers can refuse before any changes).
    ///
    /// # Errors
    /// The error `load_state_dict` would give.
    fn check_state_dict(&self, replicas: &Replicas, rank: usize, state_dict: &Value) -> Result<()>;

    /// `optimizer.load_state_dict(state_dict)` on rank `rank`. Transactional: a refused state
    /// dict (PyTorch's `ValueError` for other group counts or sizes, the state dict of
    /// another optimizer class, a malformed entry) leaves the optimizer as it was.
    ///
    /// # Errors
    /// A `ValueError` or `TypeError` naming what does not fit; a `ValueError` when `replicas` has
    /// other ranks or parameters than the optimizer was built for; an `IndexError` when `rank` is
    /// out of range; a `RuntimeError` when a state arena does not fit the memory budget or the
    /// backend fails.
    fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()>;

    /// Heals world rank `joiner`'s state (every state tensor and counter) from world rank
    /// `source`'s over `world`: a copy on the device where this process holds both, a transfer
    /// between their processes otherwise (`Communicator::heal_rows`): how an elastic run heals
    /// a rank that joins.
    ///
    /// # Errors
    /// A `ValueError` when `replicas` has other ranks or parameters than the optimizer was built
    /// for; the errors of `Communicator::heal_rows` and `Communicator::heal_bytes` (a
    /// `RuntimeError` for a GPU error, a lost device or a failed transfer).
    fn heal_rank_state(
        &mut self,
        world: &dyn crate::comm::Communicator,
        replicas: &Replicas,
        source: usize,
        joiner: usize,
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
