//! Storage-format conversion on the device: its per-parameter flags and one launch of
//! `shaders/convert.wgsl` per chunk. Its twins: the reference in `backend/kernels/convert.rs`,
//! which the CPU backend runs.

use super::GpuBackend;
use super::per_param::PerParam;
use crate::backend::Arena;
use crate::backend::kernels::ParamStarts;
use crate::error::{Error, Result};

impl GpuBackend {
    pub(crate) fn convert_on_device(
        &self,
        src: &Arena,
        dst: &mut Arena,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()> {
        crate::backend::kernels::check_convert(src, dst, starts, active)?;
        if src.chunk_len() != dst.chunk_len() {
            return Err(Error::value(format!(
                "convert: arenas do not match ({src:?} vs {dst:?})"
            )));
        }
        if starts.0.is_empty() {
            return Ok(());
        }
        let flags_buffer = self.flags_buffer("distopt convert flags", active);
        self.launch(
            src,
            starts,
            PerParam {
                kernel: &self.kernels.convert,
                overrides: &[
                    ("SRC_FORMAT", src.format().shader_code()),
                    ("DST_FORMAT", dst.format().shader_code()),
                ],
                lanes: src.ranks(),
                group_size: 0,
                tables: &[("converted", &flags_buffer)],
                arenas: &[("src", Some(self.gpu(src)?)), ("dst", Some(self.gpu(dst)?))],
            },
        )
    }
}
