//! `HierarchicalModelAverager`.

use std::sync::Arc;

use super::{
    MAX_PERIOD_ONE_WARNING, ModelAverager, admit_at, average_at, check_average_parameters,
    warmup_error,
};
use crate::comm::{Communicator, Subgroups, new_subgroups};
use crate::error::{Error, ErrorKind, Result};
use crate::replicas::Replicas;

/// Hierarchical model averaging: periods mapped to group sizes (contiguous subgroups). Call
/// number `s` averages iff `s >= warmup_steps` and some period divides `s`; the periods are
/// searched from the last inserted to the first and the first match picks the group.
///
/// ```
/// use std::sync::Arc;
/// use distopt::averaging::HierarchicalModelAverager;
/// use distopt::comm::SimulatedWorld;
/// let world = Arc::new(SimulatedWorld::new(4).unwrap());
/// let err = HierarchicalModelAverager::new(&[(2, 2), (4, 3)], 0, world).unwrap_err();
/// assert!(err.message().contains("must be equal to the size of arg ``process_group`` 4"));
/// ```
#[derive(Debug)]
pub struct HierarchicalModelAverager {
    /// `(period, groups)` in insertion order.
    levels: Vec<(i64, Subgroups)>,
    warmup_steps: u64,
    step: u64,
    world: Arc<dyn Communicator>,
    /// The ranks the last averaging healed (see [`ModelAverager::healed`]).
    healed: Vec<(usize, usize)>,
}

impl HierarchicalModelAverager {
    /// `period_group_size_dict` as `(period, group size)` pairs in insertion order (a repeated
    /// period keeps its first position and takes the last size, as a Python dict does).
    ///
    /// # Errors
    /// PyTorch's `ValueError`s, in its order: an empty dict, a first period that is not
    /// positive, a last group size other than the world size, a group size that is not
    /// positive, exceeds the world size or does not divide it ([`new_subgroups`]), then a
    /// negative `warmup_steps`. (A later period of 0 is accepted here and raises a
    /// `ZeroDivisionError` when the schedule reaches it.)
    pub fn new(
        period_group_size_dict: &[(i64, i64)],
        warmup_steps: i64,
        world: Arc<dyn Communicator>,
    ) -> Result<Self> {
        let mut dict: Vec<(i64, i64)> = Vec::new();
        for &(period, size) in period_group_size_dict {
            match dict.iter_mut().find(|(p, _)| *p == period) {
                Some(entry) => entry.1 = size,
                None => dict.push((period, size)),
            }
        }
        let world_size = world.world_size();
        let Some(&(first_period, _)) = dict.first() else {
            return Err(Error::value(
                "Arg ``period_group_size_dict`` must not be empty.",
            ));
        };
        if first_period <= 0 {
            return Err(Error::value(
                "The minimum period in arg ``period_group_size_dict`` must be a positive value.",
            ));
        }
        let &(last_period, last_size) = dict.last().expect("not empty");
        if last_period == 1 {
            crate::warnings::warn(MAX_PERIOD_ONE_WARNING);
        }
        if last_size != world_size as i64 {
            return Err(Error::value(format!(
                "The last value in arg ``period_group_size_dict`` {last_size} must be equal to the size of arg ``process_group`` {world_size}."
            )));
        }
        let mut levels = Vec::with_capacity(dict.len());
        for (period, size) in dict {
            let groups = if size == world_size as i64 {
                Subgroups::world(world_size)
            } else {
                new_subgroups(world_size, size)?
            };
            levels.push((period, groups));
        }
        if warmup_steps < 0 {
            return Err(warmup_error());
        }
        Ok(HierarchicalModelAverager {
            levels,
            warmup_steps: warmup_steps as u64,
            step: 0,
            world,
            healed: Vec::new(),
        })
    }

    /// The group partition of the call at step counter `step` (periods searched from the last
    /// key).
    fn groups_at(&self, step: u64) -> Result<Option<Subgroups>> {
        for &(period, groups) in self.levels.iter().rev() {
            if period == 0 {
                return Err(Error::new(
                    ErrorKind::ZeroDivisionError,
                    "integer modulo by zero",
                ));
            }
            if (step as i64).rem_euclid(period) == 0 {
                return Ok(Some(groups));
            }
        }
        Ok(None)
    }
}

impl ModelAverager for HierarchicalModelAverager {
    fn step(&self) -> u64 {
        self.step
    }

    fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    fn average_parameters(
        &mut self,
        replicas: &mut Replicas,
        params: Option<&[usize]>,
    ) -> Result<Option<usize>> {
        self.healed.clear();
        let groups = match self.step >= self.warmup_steps {
            true => self.groups_at(self.step)?,
            false => None,
        };
        let counter = (&mut self.step, &mut self.healed);
        average_at(self.world.as_ref(), replicas, groups, params, counter)
    }

    fn healed(&self) -> &[(usize, usize)] {
        &self.healed
    }

    fn world(&self) -> Option<&dyn Communicator> {
        Some(self.world.as_ref())
    }

    /// The groups of the sync point that admitted the joiner are those of the step counter
    /// the joiner receives, less one.
    fn admit(&mut self, replicas: &mut Replicas) -> Result<()> {
        self.healed.clear();
        let world = self.world.clone();
        let (step, healed) = admit_at(world.as_ref(), replicas, self.step, |step| {
            self.groups_at(step)?.ok_or_else(|| {
                Error::runtime(format!(
                    "the averager's step counter {step} that a joining rank was healed with averages at no level"
                ))
            })
        })?;
        self.step = step;
        self.healed = healed;
        Ok(())
    }

    fn check_average(&self, replicas: &Replicas, params: Option<&[usize]>) -> Result<()> {
        if self.step >= self.warmup_steps {
            if let Some(groups) = self.groups_at(self.step)? {
                check_average_parameters(self.world.as_ref(), replicas, groups, params)?;
            }
        }
        Ok(())
    }
}
