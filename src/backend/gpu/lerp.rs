//! torch's `lerp_` on the device (Streaming DiLoCo's merge): its per-parameter flags, the
//! coefficient, and one launch of `shaders/lerp.wgsl` per chunk. Its twins: the reference in
//! `backend/kernels/lerp.rs`, which the CPU backend runs.

use super::GpuBackend;
use super::per_param::nothing_to_dispatch;
use crate::backend::check_param_table;
use crate::backend::kernels::{Chunking, LerpArgs, check_lerp, lerp_coefficient};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn lerp_on_device(&self, args: LerpArgs<'_>) -> Result<()> {
        check_param_table("lerp", args.params, args.starts)?;
        check_lerp(&args, Chunking::Same)?;
        let bound = [
            ("end", Some(self.gpu(args.end)?)),
            ("params", Some(self.gpu(args.params)?)),
        ];
        if nothing_to_dispatch(args.params, args.starts) {
            return Ok(());
        }
        let flags_buffer = self.flags_buffer("distopt lerp flags", args.active);
        // The coefficient's float32 bits and which operand is the base (the device's arenas
        // are 32- or 16-bit: float32 arithmetic).
        let (coefficient, from_end) = lerp_coefficient(args.params.format(), args.weight);
        let weight = [(coefficient as f32).to_bits(), u32::from(from_end)];
        let weight_buffer = self.storage_buffer("distopt lerp weight", &weight);
        let kernel = &self.kernels.lerp;
        let tables = [("merged", &flags_buffer), ("weight", &weight_buffer)];
        self.launch_per_rank(kernel, args.params, args.starts, &tables, &bound)
    }
}
