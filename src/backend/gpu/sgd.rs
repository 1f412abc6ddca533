//! `torch.optim.SGD`'s step on the device: its per-(rank, parameter) table and one launch of
//! `shaders/sgd.wgsl` per chunk. Its twins: the reference in `backend/kernels/sgd.rs` and the CPU
//! backend's kernel in `backend/cpu/sgd.rs`.

use super::GpuBackend;
use super::contract::{SgdScalars as SgdGpuScalars, sgd_flags};
use super::per_param::{flag, nothing_to_dispatch};
use crate::backend::check_param_table;
use crate::backend::kernels::{Chunking, SgdArgs, check_sgd_arenas};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn sgd_on_device(&self, args: SgdArgs<'_>) -> Result<()> {
        check_param_table("sgd", args.params, args.starts)?;
        check_sgd_arenas(&args, Chunking::Same)?;
        let arenas = [
            ("params", Some(self.gpu(args.params)?)),
            ("grads", Some(self.gpu(args.grads)?)),
            ("momentum", self.gpu_opt(args.momentum.as_deref())?),
        ];
        if nothing_to_dispatch(args.params, args.starts) {
            return Ok(());
        }
        let table: Vec<SgdGpuScalars> = args
            .scalars
            .iter()
            .map(|s| SgdGpuScalars {
                flags: flag(s.active, sgd_flags::ACTIVE)
                    | flag(s.first_step, sgd_flags::FIRST_STEP)
                    | flag(s.nesterov, sgd_flags::NESTEROV)
                    | flag(s.maximize, sgd_flags::MAXIMIZE)
                    | flag(s.fused, sgd_flags::FUSED)
                    | flag(s.foreach_momentum, sgd_flags::FOREACH_MOMENTUM),
                lr: s.lr as f32,
                momentum: s.momentum as f32,
                one_minus_dampening: s.one_minus_dampening as f32,
                weight_decay: s.weight_decay as f32,
                half_tail_from: u32::try_from(s.half_tail_from).unwrap_or(u32::MAX),
                _pad: [0; 2],
            })
            .collect();
        let table_buffer = self.storage_buffer("distopt sgd scalars", &table);
        let tables = [("scalars", &table_buffer)];
        self.launch_per_rank(
            &self.kernels.sgd,
            args.params,
            args.starts,
            &tables,
            &arenas,
        )
    }
}
