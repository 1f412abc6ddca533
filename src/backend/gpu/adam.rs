//! `torch.optim.Adam`/`AdamW`'s step on the device: its per-(rank, parameter) table and one launch
//! of `shaders/adam.wgsl` per chunk. Its twins: the reference in `backend/kernels/adam.rs` and the
//! CPU backend's kernel in `backend/cpu/adam.rs`.

use super::GpuBackend;
use super::contract::{AdamScalars as AdamGpuScalars, adam_flags};
use super::per_param::{flag, nothing_to_dispatch};
use crate::backend::check_param_table;
use crate::backend::kernels::{AdamArenas, AdamScalars, Chunking, ParamStarts, check_adam_arenas};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn adam_on_device(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()> {
        let params = &*arenas.params;
        check_param_table("adam", params, starts)?;
        check_adam_arenas(&arenas, starts, scalars, Chunking::Same)?;
        let bound = [
            ("params", Some(self.gpu(params)?)),
            ("grads", Some(self.gpu(arenas.grads)?)),
            ("exp_avg", Some(self.gpu(arenas.exp_avg)?)),
            ("exp_avg_sq", Some(self.gpu(arenas.exp_avg_sq)?)),
            (
                "max_exp_avg_sq",
                self.gpu_opt(arenas.max_exp_avg_sq.as_deref())?,
            ),
        ];
        if nothing_to_dispatch(params, starts) {
            return Ok(());
        }
        let table: Vec<AdamGpuScalars> = scalars
            .iter()
            .map(|s| AdamGpuScalars {
                flags: flag(s.active, adam_flags::ACTIVE)
                    | flag(s.maximize, adam_flags::MAXIMIZE)
                    | flag(s.amsgrad, adam_flags::AMSGRAD)
                    | flag(s.decoupled, adam_flags::DECOUPLED)
                    | flag(s.fused, adam_flags::FUSED),
                weight_decay: s.weight_decay as f32,
                decay_factor: s.decay_factor as f32,
                one_minus_beta1: s.one_minus_beta1 as f32,
                beta2: s.beta2 as f32,
                one_minus_beta2: s.one_minus_beta2 as f32,
                neg_step_size: (-s.step_size) as f32,
                bias_correction2_sqrt: s.bias_correction2_sqrt as f32,
                eps: s.eps as f32,
                remainder_from: u32::try_from(s.remainder_from).unwrap_or(u32::MAX),
                half_tail_from: u32::try_from(s.half_tail_from).unwrap_or(u32::MAX),
                _pad: [0; 1],
            })
            .collect();
        let table_buffer = self.storage_buffer("distopt adam scalars", &table);
        let tables = [("scalars", &table_buffer)];
        self.launch_per_rank(&self.kernels.adam, params, starts, &tables, &bound)
    }
}
