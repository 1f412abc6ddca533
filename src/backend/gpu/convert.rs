//! Storage-format conversion on the device: its per-parameter flags and one launch of
//! `shaders/convert.wgsl` per chunk. Its twins: the reference in `backend/kernels/convert.rs`,
//! which the CPU backend runs.

use super::GpuBackend;
use super::per_param::{PerParam, nothing_to_dispatch};
use crate::backend::check_param_table;
use crate::backend::kernels::{Chunking, ConvertArgs, check_convert};
use crate::error::Result;

impl GpuBackend {
    pub(crate) fn convert_on_device(&self, args: ConvertArgs<'_>) -> Result<()> {
        check_param_table("convert", args.src, args.starts)?;
        check_convert(&args, Chunking::Same)?;
        let bound = [
            ("src", Some(self.gpu(args.src)?)),
            ("dst", Some(self.gpu(args.dst)?)),
        ];
        if nothing_to_dispatch(args.src, args.starts) {
            return Ok(());
        }
        let flags_buffer = self.flags_buffer("distopt convert flags", args.active);
        self.launch(
            args.src,
            args.starts,
            PerParam {
                kernel: &self.kernels.convert,
                overrides: &[
                    ("SRC_FORMAT", args.src.format().shader_code()),
                    ("DST_FORMAT", args.dst.format().shader_code()),
                ],
                lanes: args.src.ranks(),
                group_size: 0,
                tables: &[("converted", &flags_buffer)],
                arenas: &bound,
            },
        )
    }
}
