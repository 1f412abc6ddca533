//! DDP's gradient all-reduce with joined ranks (the scaled sum) on the device: its tables (the
//! reduced parameters, the ranks' scales, who contributes and receives) and one launch of
//! `shaders/scaled_sum.wgsl` per chunk. Its twins: the reference in
//! `backend/kernels/scaled_sum.rs`, which the CPU backend runs.

use super::GpuBackend;
use super::contract::scaled_sum_flags;
use super::per_param::{PerParam, device_arith, flag, nothing_to_dispatch};
use crate::backend::check_param_table;
use crate::backend::kernels::ScaledSumArgs;
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn scaled_sum_on_device(&self, args: ScaledSumArgs<'_>) -> Result<()> {
        check_param_table("scaled sum", args.arena, args.starts)?;
        args.check()?;
        let bound = [("arena", Some(self.gpu(args.arena)?))];
        if nothing_to_dispatch(args.arena, args.starts) {
            return Ok(());
        }
        let (ranks, params) = (args.arena.ranks(), args.starts.0.len());
        // The scale in float32, the compute precision.
        let scale_values: Vec<f32> = args
            .scales
            .iter()
            .map(|s| s.unwrap_or(0.0) as f32)
            .collect();
        let table: Vec<u32> = (0..ranks * params)
            .map(|k| {
                let (rank, _) = (k / params, k % params);
                let receives = args.scales[rank].is_some();
                flag(receives && args.present[k], scaled_sum_flags::CONTRIBUTES)
                    | flag(receives, scaled_sum_flags::RECEIVES)
            })
            .collect();
        let flags_buffer = self.flags_buffer("distopt scaled sum flags", args.reduced);
        let scales_buffer = self.storage_buffer("distopt scaled sum scales", &scale_values);
        let table_buffer = self.storage_buffer("distopt scaled sum table", &table);
        self.launch(
            args.arena,
            args.starts,
            PerParam {
                kernel: &self.kernels.scaled_sum,
                overrides: &[
                    ("FORMAT", args.arena.format().shader_code()),
                    ("ARITH", device_arith(args.arith).shader_code()),
                ],
                // One lane: the kernel sums every rank in a loop.
                lanes: 1,
                group_size: ranks,
                tables: &[
                    ("reduced", &flags_buffer),
                    ("scales", &scales_buffer),
                    ("table", &table_buffer),
                ],
                arenas: &bound,
            },
        )
    }
}
