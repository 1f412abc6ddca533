//! `torch.optim.Adam`/`AdamW`'s step on the device: its per-(rank, parameter) table and one launch
//! of `shaders/adam.wgsl` per chunk. Its twins: the reference in `backend/kernels/adam.rs` and the
//! CPU backend's kernel in `backend/cpu/adam.rs`.

use super::GpuBackend;
use super::contract::{AdamScalars as AdamGpuScalars, adam_flags};
use super::per_param::{PerParam, check_geometry, flag};
use crate::backend::kernels::{self, AdamArenas, AdamScalars, ParamStarts};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn adam_on_device(
        &self,
        arenas: AdamArenas<'_>,
        starts: &ParamStarts,
        scalars: &[AdamScalars],
    ) -> Result<()> {
        let AdamArenas {
            params,
            grads,
            exp_avg,
            exp_avg_sq,
            max_exp_avg_sq,
        } = arenas;
        check_geometry("adam", params, grads, starts, scalars.len())?;
        check_geometry("adam exp_avg", params, exp_avg, starts, scalars.len())?;
        check_geometry("adam exp_avg_sq", params, exp_avg_sq, starts, scalars.len())?;
        if let Some(x) = &max_exp_avg_sq {
            check_geometry("adam max_exp_avg_sq", params, x, starts, scalars.len())?;
        }
        kernels::check_adam_state(max_exp_avg_sq.is_some(), scalars)?;
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
                _pad: [0; 3],
            })
            .collect();
        let table_buffer = self.storage_buffer("distopt adam scalars", &table);
        let arenas = [
            ("params", Some(self.gpu(params)?)),
            ("grads", Some(self.gpu(grads)?)),
            ("exp_avg", Some(self.gpu(exp_avg)?)),
            ("exp_avg_sq", Some(self.gpu(exp_avg_sq)?)),
            ("max_exp_avg_sq", self.gpu_opt(max_exp_avg_sq.as_deref())?),
        ];
        self.launch(
            params,
            starts,
            PerParam {
                kernel: &self.kernels.adam,
                overrides: &[("FORMAT", params.format().shader_code())],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[("scalars", &table_buffer)],
                arenas: &arenas,
            },
        )
    }
}
