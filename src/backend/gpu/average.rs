//! Group averaging on the device: its per-parameter flags and one launch of
//! `shaders/average.wgsl` per chunk. Its twins: the reference in `backend/kernels/average.rs` and
//! the CPU backend's kernel in `backend/cpu/average.rs`.

use super::GpuBackend;
use super::per_param::PerParam;
use crate::backend::Arena;
use crate::backend::kernels::ParamStarts;
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

impl GpuBackend {
    pub(crate) fn average_on_device(
        &self,
        arena: &mut Arena,
        group_size: usize,
        arith: StorageFormat,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()> {
        let ranks = arena.ranks();
        if group_size == 0
            || !ranks.is_multiple_of(group_size)
            || active.len() != starts.0.len()
            || starts.0.is_empty()
        {
            return Err(Error::value(format!(
                "average: group size {group_size} does not divide {ranks} ranks, or {} flags for {} parameters",
                active.len(),
                starts.0.len()
            )));
        }
        // The device computes in float32 at most; a float64 promotion of non-float64 arenas
        // is computed in float32 (within a float32 ulp of the float64 result).
        let arith = if arith == StorageFormat::F64 {
            StorageFormat::F32
        } else {
            arith
        };
        let flags_buffer = self.flags_buffer("distopt average flags", active);
        self.launch(
            arena,
            starts,
            PerParam {
                kernel: &self.kernels.average,
                overrides: &[
                    ("FORMAT", arena.format().shader_code()),
                    ("ARITH", arith.shader_code()),
                ],
                lanes: ranks / group_size,
                group_size,
                tables: &[("averaged", &flags_buffer)],
                arenas: &[("arena", Some(self.gpu(arena)?))],
            },
        )
    }
}
