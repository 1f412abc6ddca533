//! [`Join`]: the join context manager over a list of joinables.

use std::sync::Arc;

use super::context::{JoinContext, ended};
use super::messages::{MULTIPLE_PROCESS_GROUPS, NO_JOINABLES, exhausted_message};
use super::options::JoinOptions;
use super::{JoinConfig, Joinable, ProcessGroup};
use crate::backend::BackendInfo;
use crate::error::{Error, RankErrors, Result};
use crate::replicas::Replicas;

/// `torch.distributed.algorithms.Join` over a list of joinables, run in lock-step (see the
/// [module documentation](super)).
#[derive(Debug)]
pub struct Join {
    context: Arc<JoinContext>,
    joinables: usize,
    process_group: ProcessGroup,
    device: BackendInfo,
}

impl Join {
    /// `Join(joinables, enable, throw_on_early_termination, divide_by_initial_world_size=…)`:
    /// configures every joinable (the first one notifies the context at each iteration) and
    /// checks that they share one process group. `ValueError`s as PyTorch's.
    ///
    /// # Errors
    /// A `ValueError` when `joinables` is empty ([`NO_JOINABLES`]) or they do not share one process
    /// group ([`MULTIPLE_PROCESS_GROUPS`]). Every joinable's `join_hook` has run by then (DDP has
    /// recorded `divide_by_initial_world_size`).
    pub fn new(joinables: &mut [&mut dyn Joinable], options: JoinOptions) -> Result<Join> {
        if joinables.is_empty() {
            return Err(Error::value(NO_JOINABLES));
        }
        // `join_hook(**kwargs)` of every joinable, as the constructor calls it (DDP records
        // `divide_by_initial_world_size` there).
        for joinable in joinables.iter_mut() {
            drop(joinable.join_hook(&options));
        }
        let process_group = joinables[0].join_process_group();
        if joinables[1..]
            .iter()
            .any(|j| j.join_process_group() != process_group)
        {
            return Err(Error::value(MULTIPLE_PROCESS_GROUPS));
        }
        let device = joinables[0].join_device();
        let context = Arc::new(JoinContext::new(process_group.world.clone(), options));
        for (k, joinable) in joinables.iter_mut().enumerate() {
            joinable.set_join_config(JoinConfig {
                enable: options.enable,
                throw_on_early_termination: options.throw_on_early_termination,
                is_first_joinable: k == 0,
                context: Some(context.clone()),
            });
        }
        Ok(Join {
            context,
            joinables: joinables.len(),
            process_group,
            device,
        })
    }

    /// The options.
    pub fn options(&self) -> JoinOptions {
        self.context.options
    }

    /// The process group of the context's collectives (the first joinable's).
    pub fn process_group(&self) -> &ProcessGroup {
        &self.process_group
    }

    /// The device of the context's collectives (the first joinable's).
    pub fn device(&self) -> &BackendInfo {
        &self.device
    }

    /// Per local rank: whether it has joined.
    pub fn joined(&self) -> Vec<bool> {
        self.context.joined()
    }

    /// The number of ranks (world-wide) that had inputs at the last notification, once the
    /// first joinable has notified.
    pub fn active_ranks(&self) -> Option<usize> {
        self.context.lock().active
    }

    /// Per local rank: shadow iterations it has run since it joined.
    pub fn shadow_iterations(&self) -> Vec<u64> {
        self.context.lock().shadowed.clone()
    }

    /// The start of a global iteration, in lock-step: `has_input[i]` says whether local rank i
    /// still has an input. A rank without one joins (it has left its training loop): from now
    /// on the joinables' calls run its main hooks. A joined rank cannot take inputs again.
    /// With the context disabled (`enable=False`) uneven inputs are an error: in PyTorch the
    /// ranks with inputs would wait forever for the others.
    ///
    /// # Errors
    /// A `RuntimeError` when the context has ended (a rank raised, or it was exited) or, with the
    /// context disabled, when some local ranks have an input and others do not; a `ValueError` when
    /// `has_input` does not hold one flag per local rank or a joined rank has an input again.
    pub fn iteration(&mut self, has_input: &[bool]) -> Result<()> {
        let local = self.context.local();
        let mut state = self.context.lock();
        if state.ended {
            return Err(ended());
        }
        if has_input.len() != state.joined.len() {
            return Err(Error::value(format!(
                "{} input flags for the {} local ranks of this process",
                has_input.len(),
                state.joined.len()
            )));
        }
        if let Some(i) = (0..has_input.len()).find(|&i| has_input[i] && state.joined[i]) {
            return Err(Error::value(format!(
                "rank {} ran out of inputs at an earlier iteration: a rank that joined cannot take inputs again",
                local.start + i
            )));
        }
        if !self.context.options.enable && has_input.contains(&false) && has_input.contains(&true) {
            let (without, with) = (
                has_input.iter().position(|h| !h).unwrap_or(0),
                has_input.iter().position(|h| *h).unwrap_or(0),
            );
            return Err(Error::runtime(format!(
                "uneven inputs with the join context disabled (enable=False): rank {} has no input while rank {} has one, so rank {} would wait forever in its collectives",
                local.start + without,
                local.start + with,
                local.start + with
            )));
        }
        for (joined, &has) in state.joined.iter_mut().zip(has_input) {
            *joined |= !has;
        }
        Ok(())
    }

    /// The end of the `with` block (`__exit__`): every local rank has joined. While ranks of
    /// other processes still have inputs, runs shadow iterations (the context's all-reduce,
    /// then every joinable's main hook, in order); then every joinable's post-hook, with
    /// whether each local rank was among the last to join. `joinables` are the ones the
    /// context was created with, in the same order. With `throw_on_early_termination`, a
    /// shadow iteration raises instead (`Rank r exhausted all inputs.`). A disabled context
    /// does nothing, as in PyTorch.
    ///
    /// # Errors
    /// On every local rank: a `ValueError` when `joinables` are not the context's, in order; a
    /// `RuntimeError` when the context has ended; with `throw_on_early_termination`, while ranks
    /// elsewhere still have inputs, the `RuntimeError` [`exhausted_message`]; the world's errors
    /// and those of the joinables' main hooks and post-hooks ([`JoinHook`](super::JoinHook)). A
    /// refused `joinables` list, a failed all-reduce or a failed main hook leave the context open;
    /// after any other outcome it has ended.
    pub fn exit(
        &mut self,
        joinables: &mut [&mut dyn Joinable],
        replicas: &mut Replicas,
    ) -> Result<(), RankErrors> {
        let local = self.context.local();
        let all = |e: Error| RankErrors::all(local.clone(), e);
        let ours = |j: &&mut dyn Joinable| {
            j.join_config()
                .context
                .as_ref()
                .is_some_and(|c| Arc::ptr_eq(c, &self.context))
        };
        if joinables.len() != self.joinables || !joinables.iter().all(ours) {
            return Err(all(Error::value(format!(
                "exit() takes the {} joinables this Join was created with, in order",
                self.joinables
            ))));
        }
        let options = self.context.options;
        {
            let mut state = self.context.lock();
            if state.ended {
                return Err(all(ended()));
            }
            if !options.enable {
                state.ended = true;
                return Ok(());
            }
            state.joined.fill(true);
        }
        loop {
            let active = {
                let mut state = self.context.lock();
                self.context.warn_skew(&mut state);
                let zeros = vec![vec![0f32]; state.joined.len()];
                self.context.world.all_reduce_sum_f32(&zeros).map_err(all)?[0] as usize
            };
            if active == 0 {
                break;
            }
            if options.throw_on_early_termination {
                let ones = vec![vec![1f32]; local.len()];
                self.context.world.all_reduce_sum_f32(&ones).map_err(all)?;
                self.context.lock().ended = true;
                return Err(RankErrors::on_ranks(local.clone(), |r| {
                    Error::runtime(exhausted_message(r))
                }));
            }
            for joinable in joinables.iter_mut() {
                joinable
                    .join_hook(&options)
                    .main_hook(replicas)
                    .map_err(all)?;
            }
            let mut state = self.context.lock();
            for s in &mut state.shadowed {
                *s += 1;
            }
        }
        let is_last_joiner: Vec<bool> = {
            let mut state = self.context.lock();
            state.ended = true;
            state.shadowed.iter().map(|&s| s == 0).collect()
        };
        for joinable in joinables.iter_mut() {
            joinable
                .join_hook(&options)
                .post_hook(replicas, &is_last_joiner)
                .map_err(all)?;
        }
        Ok(())
    }
}
