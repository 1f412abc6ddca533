//! DDP's gradient all-reduce with joined ranks (the scaled sum) on the device: its tables (the
//! reduced parameters, the ranks' scales, who contributes and receives) and one launch of
//! `shaders/scaled_sum.wgsl` per chunk. Its twins: the reference in
//! `backend/kernels/scaled_sum.rs`, which the CPU backend runs.

use super::GpuBackend;
use super::contract::scaled_sum_flags;
use super::per_param::{PerParam, flag};
use crate::backend::Arena;
use crate::backend::kernels::ParamStarts;
use crate::dtype::StorageFormat;
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn scaled_sum_on_device(
        &self,
        arena: &mut Arena,
        arith: StorageFormat,
        starts: &ParamStarts,
        reduced: &[bool],
        scales: &[Option<f64>],
        present: &[bool],
    ) -> Result<()> {
        crate::backend::kernels::check_scaled_sum(arena, starts, reduced, scales, present)?;
        if starts.0.is_empty() {
            return Ok(());
        }
        // The device computes in float32 at most (float64 arenas live on the host).
        let arith = if arith == StorageFormat::F64 {
            StorageFormat::F32
        } else {
            arith
        };
        let (ranks, params) = (arena.ranks(), starts.0.len());
        // The scale in float32, the compute precision.
        let scale_values: Vec<f32> = scales.iter().map(|s| s.unwrap_or(0.0) as f32).collect();
        let table: Vec<u32> = (0..ranks * params)
            .map(|k| {
                let (rank, _) = (k / params, k % params);
                let receives = scales[rank].is_some();
                flag(receives && present[k], scaled_sum_flags::CONTRIBUTES)
                    | flag(receives, scaled_sum_flags::RECEIVES)
            })
            .collect();
        let flags_buffer = self.flags_buffer("distopt scaled sum flags", reduced);
        let scales_buffer = self.storage_buffer("distopt scaled sum scales", &scale_values);
        let table_buffer = self.storage_buffer("distopt scaled sum table", &table);
        self.launch(
            arena,
            starts,
            PerParam {
                kernel: &self.kernels.scaled_sum,
                overrides: &[
                    ("FORMAT", arena.format().shader_code()),
                    ("ARITH", arith.shader_code()),
                ],
                // One lane: the kernel sums every rank in a loop.
                lanes: 1,
                group_size: ranks,
                tables: &[
                    ("reduced", &flags_buffer),
                    ("scales", &scales_buffer),
                    ("table", &table_buffer),
                ],
                arenas: &[("arena", Some(self.gpu(arena)?))],
            },
        )
    }
}
