//! The lock-step state a join context's joinables share (`JoinContext`), which [`Join`](super::Join)
//! drives.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::messages::{EARLY_TERMINATION, WARN_THRESHOLD, exhausted_message, skew_warning};
use super::options::JoinOptions;
use crate::comm::Communicator;
use crate::error::{Error, RankErrors, Result};
use crate::warnings::{self, Warning};

/// Where the context stands for the local ranks.
#[derive(Debug)]
pub(super) struct JoinState {
    /// Per local rank: it ran out of inputs (it is in its exit loop).
    pub(super) joined: Vec<bool>,
    /// Per local rank: shadow iterations it ran (PyTorch's loop counter `i`).
    pub(super) shadowed: Vec<u64>,
    /// Per local rank: the skew warning was emitted (PyTorch filters it "once").
    pub(super) warned: Vec<bool>,
    /// The ranks with inputs at the last notification, world-wide.
    pub(super) active: Option<usize>,
    /// A rank raised (`throw_on_early_termination`), or the context was exited.
    pub(super) ended: bool,
}

/// The state a [`Join`](super::Join) shares with its joinables.
#[derive(Debug)]
pub(crate) struct JoinContext {
    pub(super) world: Arc<dyn Communicator>,
    pub(super) options: JoinOptions,
    state: Mutex<JoinState>,
}

impl JoinContext {
    /// A context over `world`'s local ranks, none of which has joined.
    pub(super) fn new(world: Arc<dyn Communicator>, options: JoinOptions) -> JoinContext {
        let local = world.local_ranks().len();
        JoinContext {
            world,
            options,
            state: Mutex::new(JoinState {
                joined: vec![false; local],
                shadowed: vec![0; local],
                warned: vec![false; local],
                active: None,
                ended: false,
            }),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, JoinState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn local(&self) -> Range<usize> {
        self.world.local_ranks()
    }

    /// Per local rank: joined.
    pub(crate) fn joined(&self) -> Vec<bool> {
        self.lock().joined.clone()
    }

    /// The top of a shadow iteration for the joined ranks: the skew warning, once per rank,
    /// after more than [`WARN_THRESHOLD`] shadow iterations.
    pub(super) fn warn_skew(&self, state: &mut JoinState) {
        let first = self.local().start;
        for i in 0..state.joined.len() {
            if state.joined[i] && state.shadowed[i] > WARN_THRESHOLD && !state.warned[i] {
                state.warned[i] = true;
                warnings::emit(Warning::user(skew_warning(first + i)).on_ranks([first + i]));
            }
        }
    }

    /// `notify_join_context` for the active local ranks and `_get_num_nonjoined_procs` for
    /// the joined ones, as one all-reduce; then, with `throw_on_early_termination`, the
    /// all-reduce that tells every rank whether one has run out of inputs. Returns the number
    /// of ranks with inputs.
    pub(crate) fn notify(&self) -> Result<usize, RankErrors> {
        let local = self.local();
        let all = |e: Error| RankErrors::all(local.clone(), e);
        let mut state = self.lock();
        if state.ended {
            return Err(all(ended()));
        }
        self.warn_skew(&mut state);
        let counts: Vec<Vec<f32>> = state
            .joined
            .iter()
            .map(|&j| vec![if j { 0.0 } else { 1.0 }])
            .collect();
        let active = self.world.all_reduce_sum_f32(&counts).map_err(all)?[0] as usize;
        if self.options.throw_on_early_termination {
            // Joined ranks that see active ranks notify them and raise; the active ones learn
            // of it from the same all-reduce.
            let flags: Vec<Vec<f32>> = state
                .joined
                .iter()
                .map(|&j| vec![if j && active > 0 { 1.0 } else { 0.0 }])
                .collect();
            let exhausted = self.world.all_reduce_sum_f32(&flags).map_err(all)?[0];
            if exhausted > 0.0 {
                state.ended = true;
                let joined = state.joined.clone();
                return Err(RankErrors::on_ranks(local.clone(), |r| {
                    if joined[r - local.start] {
                        Error::runtime(exhausted_message(r))
                    } else {
                        Error::runtime(EARLY_TERMINATION)
                    }
                }));
            }
        }
        if active > 0 {
            // The joined ranks run their main hooks in this iteration's collectives.
            for i in 0..state.joined.len() {
                if state.joined[i] {
                    state.shadowed[i] += 1;
                }
            }
        }
        state.active = Some(active);
        Ok(active)
    }
}

/// The error of a call into a context that has ended.
pub(super) fn ended() -> Error {
    Error::runtime("this join context has ended (a rank raised or it was exited): start a new one")
}
