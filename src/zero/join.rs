//! ZeRO as a [`Joinable`]: its join hook steps once per shadow iteration, so that a joined
//! rank's broadcasts pair with the active ranks' (`_ZeROJoinHook`).

use crate::backend::BackendInfo;
use crate::error::Result;
use crate::join::{JoinConfig, JoinHook, JoinOptions, Joinable, ProcessGroup};
use crate::replicas::Replicas;
use crate::warnings;

use super::ZeroRedundancyOptimizer;

/// `_ZeROJoinHook`.
struct ZeroJoinHook<'a> {
    zero: &'a mut ZeroRedundancyOptimizer,
}

impl JoinHook for ZeroJoinHook<'_> {
    /// `zero.step()`: the joined ranks update the parameters they own from the gradients they
    /// still hold and broadcast them. Unlike PyTorch's, this step does not notify the join
    /// context again (PyTorch's does when ZeRO is the first joinable, which desynchronizes
    /// the collectives of joined and active ranks).
    fn main_hook(&mut self, replicas: &mut Replicas) -> Result<()> {
        let local = self.zero.world.local_ranks();
        warnings::with_ranks(local, || self.zero.local_step(replicas))
    }

    /// Nothing to do.
    fn post_hook(&mut self, _replicas: &mut Replicas, _is_last_joiner: &[bool]) -> Result<()> {
        Ok(())
    }
}

impl Joinable for ZeroRedundancyOptimizer {
    /// ZeRO's hook takes no keyword arguments.
    fn join_hook(&mut self, _options: &JoinOptions) -> Box<dyn JoinHook + '_> {
        Box::new(ZeroJoinHook { zero: self })
    }

    /// The backend of its replicas.
    fn join_device(&self) -> BackendInfo {
        self.backend.info().clone()
    }

    /// The whole world.
    fn join_process_group(&self) -> ProcessGroup {
        ProcessGroup::world(self.world.clone())
    }

    fn join_config(&self) -> &JoinConfig {
        &self.join_config
    }

    fn set_join_config(&mut self, config: JoinConfig) {
        self.join_config = config;
    }
}
