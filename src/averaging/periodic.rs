//! `PeriodicModelAverager`.

use std::sync::Arc;

use super::{
    ModelAverager, PERIOD_ONE_WARNING, admit_at, average_at, check_average_parameters, warmup_error,
};
use crate::comm::{Communicator, Subgroups};
use crate::error::{Error, Result};
use crate::replicas::Replicas;

/// Averages parameters every `period` steps after `warmup_steps` warm-up steps:
/// call number `s` averages iff `s >= warmup_steps` and `(s - warmup_steps) % period == 0`.
///
/// ```
/// use distopt::BlockOn;
/// use std::sync::Arc;
/// use distopt::averaging::{ModelAverager, PeriodicModelAverager};
/// use distopt::comm::SimulatedWorld;
/// use distopt::replicas::Replicas;
/// use distopt::{CpuBackend, Tensor};
/// let world = Arc::new(SimulatedWorld::new(2).unwrap());
/// let t = |x: f32| vec![Tensor::from_f32(&[1], vec![x]).unwrap()];
/// let mut model = Replicas::new(Arc::new(CpuBackend::new()), &[t(1.0), t(3.0)]).unwrap();
/// for rank in 0..2 { model.set_grads(rank, &[Some(Tensor::from_f32(&[1], vec![0.0]).unwrap())]).unwrap(); }
/// let mut averager = PeriodicModelAverager::new(2, 0, world).unwrap();
/// assert_eq!(averager.average_parameters(&mut model, None).unwrap(), Some(2));
/// assert_eq!(model.param(1, 0).block_on().unwrap().values_f64().unwrap(), vec![2.0]);
/// assert_eq!(averager.average_parameters(&mut model, None).unwrap(), None); // step 1: no
/// assert!(PeriodicModelAverager::new(0, 0, Arc::new(SimulatedWorld::new(2).unwrap())).is_err());
/// ```
#[derive(Debug)]
pub struct PeriodicModelAverager {
    period: u64,
    warmup_steps: u64,
    step: u64,
    world: Arc<dyn Communicator>,
    /// The ranks the last averaging healed (see [`ModelAverager::healed`]).
    healed: Vec<(usize, usize)>,
    group: Subgroups,
}

impl PeriodicModelAverager {
    /// Averages over the whole world. Errors and warnings as PyTorch's constructor (the
    /// `warmup_steps` check comes first).
    ///
    /// # Errors
    /// As [`Self::with_group`].
    pub fn new(period: i64, warmup_steps: i64, world: Arc<dyn Communicator>) -> Result<Self> {
        let group = Subgroups::world(world.world_size());
        Self::with_group(period, warmup_steps, world, group)
    }

    /// Averages within each group of `group` (a `process_group` of PyTorch).
    ///
    /// # Errors
    /// A `ValueError` when `warmup_steps` is negative (checked first) or `period` is not
    /// positive. `group` is not checked against `world` here: a partition of another world
    /// size fails at the first averaging, in [`ModelAverager::average_parameters`].
    pub fn with_group(
        period: i64,
        warmup_steps: i64,
        world: Arc<dyn Communicator>,
        group: Subgroups,
    ) -> Result<Self> {
        if warmup_steps < 0 {
            return Err(warmup_error());
        }
        if period < 1 {
            return Err(Error::value("Arg ``period`` must be a positive value."));
        }
        if period == 1 {
            crate::warnings::warn(PERIOD_ONE_WARNING);
        }
        Ok(PeriodicModelAverager {
            period: period as u64,
            warmup_steps: warmup_steps as u64,
            step: 0,
            world,
            group,
            healed: Vec::new(),
        })
    }

    /// The averaging period.
    pub fn period(&self) -> u64 {
        self.period
    }

    /// The warm-up steps.
    pub fn warmup_steps(&self) -> u64 {
        self.warmup_steps
    }

    /// Whether the call at the current step averages.
    fn averages_now(&self) -> bool {
        self.step >= self.warmup_steps
            && (self.step - self.warmup_steps).is_multiple_of(self.period)
    }
}

impl ModelAverager for PeriodicModelAverager {
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
        let groups = self.averages_now().then_some(self.group);
        let counter = (&mut self.step, &mut self.healed);
        average_at(self.world.as_ref(), replicas, groups, params, counter)
    }

    fn healed(&self) -> &[(usize, usize)] {
        &self.healed
    }

    fn world(&self) -> Option<&dyn Communicator> {
        Some(self.world.as_ref())
    }

    fn admit(&mut self, replicas: &mut Replicas) -> Result<()> {
        self.healed.clear();
        let group = self.group;
        let (step, healed) = admit_at(self.world.as_ref(), replicas, self.step, |_| Ok(group))?;
        self.step = step;
        self.healed = healed;
        Ok(())
    }

    fn check_average(&self, replicas: &Replicas, params: Option<&[usize]>) -> Result<()> {
        if self.averages_now() {
            check_average_parameters(self.world.as_ref(), replicas, self.group, params)?;
        }
        Ok(())
    }
}
