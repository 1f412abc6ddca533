//! `torch.optim.SGD`'s step on the device: its per-(rank, parameter) table and one launch of
//! `shaders/sgd.wgsl` per chunk. Its twins: the reference in `backend/kernels/sgd.rs` and the CPU
//! backend's kernel in `backend/cpu/sgd.rs`.

use super::GpuBackend;
use super::contract::{SgdScalars as SgdGpuScalars, sgd_flags};
use super::per_param::{PerParam, check_geometry, flag};
use crate::backend::Arena;
use crate::backend::kernels::{self, ParamStarts, SgdScalars};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn sgd_on_device(
        &self,
        params: &mut Arena,
        grads: &Arena,
        momentum: Option<&mut Arena>,
        starts: &ParamStarts,
        scalars: &[SgdScalars],
    ) -> Result<()> {
        check_geometry("sgd", params, grads, starts, scalars.len())?;
        if let Some(m) = &momentum {
            check_geometry("sgd momentum", params, m, starts, scalars.len())?;
        }
        kernels::check_sgd_state(momentum.is_some(), scalars)?;
        let table: Vec<SgdGpuScalars> = scalars
            .iter()
            .map(|s| SgdGpuScalars {
                flags: flag(s.active, sgd_flags::ACTIVE)
                    | flag(s.first_step, sgd_flags::FIRST_STEP)
                    | flag(s.nesterov, sgd_flags::NESTEROV)
                    | flag(s.maximize, sgd_flags::MAXIMIZE)
                    | flag(s.fused, sgd_flags::FUSED),
                lr: s.lr as f32,
                momentum: s.momentum as f32,
                one_minus_dampening: s.one_minus_dampening as f32,
                weight_decay: s.weight_decay as f32,
                _pad: [0; 3],
            })
            .collect();
        let table_buffer = self.storage_buffer("distopt sgd scalars", &table);
        let momentum = self.gpu_opt(momentum.as_deref())?;
        self.launch(
            params,
            starts,
            PerParam {
                kernel: &self.kernels.sgd,
                overrides: &[("FORMAT", params.format().shader_code())],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[("scalars", &table_buffer)],
                arenas: &[
                    ("params", Some(self.gpu(params)?)),
                    ("grads", Some(self.gpu(grads)?)),
                    ("momentum", momentum),
                ],
            },
        )
    }
}
