//! Group averaging on the device: its per-parameter flags and one launch of
//! `shaders/average.wgsl` per chunk. Its twins: the reference in `backend/kernels/average.rs` and
//! the CPU backend's kernel in `backend/cpu/average.rs`.

use super::GpuBackend;
use super::per_param::{PerParam, device_arith, nothing_to_dispatch};
use crate::backend::check_param_table;
use crate::backend::kernels::{AverageArgs, MeanOrder, check_average_args};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn average_on_device(&self, args: AverageArgs<'_>) -> Result<()> {
        check_param_table("average", args.arena, args.starts)?;
        check_average_args(&args)?;
        let bound = [("arena", Some(self.gpu(args.arena)?))];
        if nothing_to_dispatch(args.arena, args.starts) {
            return Ok(());
        }
        let flags_buffer = self.flags_buffer("distopt average flags", args.active);
        self.launch(
            args.arena,
            args.starts,
            PerParam {
                kernel: &self.kernels.average,
                overrides: &[
                    ("FORMAT", args.arena.format().shader_code()),
                    ("ARITH", device_arith(args.arith).shader_code()),
                    (
                        "SUM_FIRST",
                        u32::from(args.order == MeanOrder::SumThenDivide),
                    ),
                ],
                lanes: args.arena.ranks() / args.group_size,
                group_size: args.group_size,
                tables: &[("averaged", &flags_buffer)],
                arenas: &bound,
            },
        )
    }
}
