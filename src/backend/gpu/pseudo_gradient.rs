//! DiLoCo's pseudo-gradient on the device: its per-parameter flags and one launch of
//! `shaders/pseudo_gradient.wgsl` per chunk. Its twins: the reference in
//! `backend/kernels/pseudo_gradient.rs`, which the CPU backend runs.

use super::GpuBackend;
use super::per_param::nothing_to_dispatch;
use crate::backend::check_param_table;
use crate::backend::kernels::{Chunking, PseudoGradientArgs, check_pseudo_gradient};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn pseudo_gradient_on_device(&self, args: PseudoGradientArgs<'_>) -> Result<()> {
        check_param_table("pseudo_gradient", args.params, args.starts)?;
        check_pseudo_gradient(&args, Chunking::Same)?;
        let bound = [
            ("backup", Some(self.gpu(args.backup)?)),
            ("params", Some(self.gpu(args.params)?)),
            ("grads", Some(self.gpu(args.grads)?)),
        ];
        if nothing_to_dispatch(args.params, args.starts) {
            return Ok(());
        }
        let flags_buffer = self.flags_buffer("distopt pseudo_gradient flags", args.active);
        let kernel = &self.kernels.pseudo_gradient;
        let tables = [("synced", &flags_buffer)];
        self.launch_per_rank(kernel, args.params, args.starts, &tables, &bound)
    }
}
