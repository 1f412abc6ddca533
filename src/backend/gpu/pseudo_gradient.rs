//! DiLoCo's pseudo-gradient on the device: its per-parameter flags and one launch of
//! `shaders/pseudo_gradient.wgsl` per chunk. Its twins: the reference in
//! `backend/kernels/pseudo_gradient.rs`, which the CPU backend runs.

use super::GpuBackend;
use super::per_param::{PerParam, check_geometry};
use crate::backend::Arena;
use crate::backend::kernels::ParamStarts;
use crate::error::{Error, Result};

impl GpuBackend {
    pub(crate) fn pseudo_gradient_on_device(
        &self,
        params: &mut Arena,
        backup: &Arena,
        grads: &mut Arena,
        starts: &ParamStarts,
        active: &[bool],
    ) -> Result<()> {
        let entries = params.ranks() * starts.0.len();
        check_geometry("pseudo_gradient backup", params, backup, starts, entries)?;
        check_geometry("pseudo_gradient grads", params, grads, starts, entries)?;
        if active.len() != starts.0.len() {
            return Err(Error::value(format!(
                "pseudo_gradient: {} flags for {} parameters",
                active.len(),
                starts.0.len()
            )));
        }
        let flags_buffer = self.flags_buffer("distopt pseudo_gradient flags", active);
        self.launch(
            params,
            starts,
            PerParam {
                kernel: &self.kernels.pseudo_gradient,
                overrides: &[("FORMAT", params.format().shader_code())],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[("synced", &flags_buffer)],
                arenas: &[
                    ("backup", Some(self.gpu(backup)?)),
                    ("params", Some(self.gpu(params)?)),
                    ("grads", Some(self.gpu(grads)?)),
                ],
            },
        )
    }
}
