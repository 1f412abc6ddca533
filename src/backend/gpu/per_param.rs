//! What the GPU backend's per-parameter kernels share (SGD, Adam/AdamW, group averaging,
//! DDP's scaled sum, DiLoCo's pseudo-gradient, format conversion: one file each beside this
//! one, `sgd.rs` for `shaders/sgd.wgsl` and so on): the parameter table and the small storage
//! tables they read, one launch per chunk of an arena ([`GpuBackend::launch`]), and when
//! there is nothing to launch.

use wgpu::util::DeviceExt;

use super::contract::{BLOCK_ELEMENTS, Dispatch};
use super::kernel::Kernel;
use super::{GpuArena, GpuBackend};
use crate::backend::Arena;
use crate::backend::kernels::ParamStarts;
use crate::dtype::StorageFormat;
use crate::error::Result;

/// `bit` where `on`, else 0: one flag of a kernel's table entry.
pub(super) fn flag(on: bool, bit: u32) -> u32 {
    if on { bit } else { 0 }
}

impl GpuBackend {
    pub(super) fn storage_buffer<T: bytemuck::Pod>(
        &self,
        label: &str,
        items: &[T],
    ) -> wgpu::Buffer {
        let bytes: &[u8] = bytemuck::cast_slice(items);
        // WebGPU rejects zero-sized bindings.
        let contents = if bytes.is_empty() {
            &[0u8; 16][..]
        } else {
            bytes
        };
        self.shared
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE,
            })
    }

    /// The parameter starts followed by, for every block of [`BLOCK_ELEMENTS`] elements of the
    /// rank space, the parameter its first element belongs to: a kernel then finds an
    /// element's parameter by a short forward scan from its block's entry, so the cost of the
    /// lookup does not grow with the number of parameters.
    pub(super) fn param_table_buffer(&self, starts: &ParamStarts, rank_len: usize) -> wgpu::Buffer {
        let blocks = rank_len.div_ceil(BLOCK_ELEMENTS);
        let mut table = Vec::with_capacity(starts.0.len() + blocks);
        table.extend_from_slice(&starts.0);
        let mut j = 0usize;
        for block in 0..blocks {
            let element = block * BLOCK_ELEMENTS;
            while j + 1 < starts.0.len() && starts.0[j + 1] as usize <= element {
                j += 1;
            }
            table.push(j as u32);
        }
        self.storage_buffer("distopt param table", &table)
    }

    /// One launch of a per-parameter kernel: for every chunk of `layout`'s arenas, the
    /// [`Dispatch`] geometry (bound as `geometry`), the parameter table (`starts`),
    /// `launch.tables` and each arena's chunk (the placeholder for an absent one), each bound
    /// by its name; one compute pass.
    pub(super) fn launch(
        &self,
        layout: &Arena,
        starts: &ParamStarts,
        launch: PerParam<'_>,
    ) -> Result<()> {
        let PerParam {
            kernel,
            overrides,
            lanes,
            group_size,
            tables,
            arenas,
        } = launch;
        let gpu = self.gpu(layout)?;
        let starts_buffer = self.param_table_buffer(starts, layout.rank_len());
        let pipeline = kernel.pipeline(&self.shared, overrides)?;
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            let mut first_element = 0usize;
            for (c, chunk) in gpu.chunks.iter().enumerate() {
                let geometry = Dispatch {
                    // Chunks hold whole 64-element parameter slots: eight-element groups and
                    // whole vec4<u32> words per rank.
                    octets: (chunk.len / 8) as u32,
                    first_octet: (first_element / 8) as u32,
                    rank_quads: (chunk.rank_words / 4) as u32,
                    ranks: lanes as u32,
                    params: starts.0.len() as u32,
                    group_size: group_size as u32,
                    _pad: [0; 2],
                };
                let uniform = self.shared.uniform_buffer("distopt geometry", &geometry);
                let mut buffers: Vec<(&str, &wgpu::Buffer)> =
                    vec![("geometry", &uniform), ("starts", &starts_buffer)];
                buffers.extend_from_slice(tables);
                buffers.extend(arenas.iter().map(|&(name, a)| {
                    (name, a.map_or(&self.placeholder, |a| &a.chunks[c].buffer))
                }));
                self.dispatch(&mut pass, kernel, &buffers, chunk.len / 8 * lanes)?;
                first_element += chunk.len;
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    /// One `u32` flag per entry (1 where set), as a storage buffer.
    pub(super) fn flags_buffer(&self, label: &str, flags: &[bool]) -> wgpu::Buffer {
        let words: Vec<u32> = flags.iter().map(|&f| u32::from(f)).collect();
        self.storage_buffer(label, &words)
    }

    /// The arena of `arena` if it is given.
    pub(super) fn gpu_opt<'a>(&self, arena: Option<&'a Arena>) -> Result<Option<&'a GpuArena>> {
        arena.map(|a| self.gpu(a)).transpose()
    }

    /// [`GpuBackend::launch`] of a kernel that works on every rank's row of `params` on its own
    /// (SGD, Adam/AdamW, the pseudo-gradient): one lane per rank, specialized to the
    /// parameters' format (`FORMAT`).
    pub(super) fn launch_per_rank(
        &self,
        kernel: &Kernel,
        params: &Arena,
        starts: &ParamStarts,
        tables: &[(&str, &wgpu::Buffer)],
        arenas: &[(&str, Option<&GpuArena>)],
    ) -> Result<()> {
        self.launch(
            params,
            starts,
            PerParam {
                kernel,
                overrides: &[("FORMAT", params.format().shader_code())],
                lanes: params.ranks(),
                group_size: 0,
                tables,
                arenas,
            },
        )
    }
}

/// What [`GpuBackend::launch`] binds and how it spreads the grid.
pub(super) struct PerParam<'a> {
    pub(super) kernel: &'a Kernel,
    /// The values of the kernel's `override` constants, by name.
    pub(super) overrides: &'a [(&'a str, u32)],
    /// Lanes of the grid per eight elements (ranks, or groups when averaging).
    pub(super) lanes: usize,
    /// [`Dispatch::group_size`].
    pub(super) group_size: usize,
    /// The kernel's other storage buffers, by binding name.
    pub(super) tables: &'a [(&'a str, &'a wgpu::Buffer)],
    /// The arenas, by binding name, one chunk at a time.
    pub(super) arenas: &'a [(&'a str, Option<&'a GpuArena>)],
}

/// The precision a kernel's `ARITH` computes in on the device: float32 at most (float64 arenas
/// live on the host; a float64 promotion of other arenas is computed in float32, within a
/// float32 ulp of the float64 result).
pub(super) fn device_arith(arith: StorageFormat) -> StorageFormat {
    if arith == StorageFormat::F64 {
        StorageFormat::F32
    } else {
        arith
    }
}

/// Whether a per-parameter kernel over `layout`'s arenas has nothing to dispatch (every
/// backend's answer is then to change nothing, after the checks): an arena without ranks has
/// no storage to bind, and the kernels' parameter lookup needs at least one parameter.
pub(super) fn nothing_to_dispatch(layout: &Arena, starts: &ParamStarts) -> bool {
    layout.ranks() == 0 || starts.0.is_empty()
}
