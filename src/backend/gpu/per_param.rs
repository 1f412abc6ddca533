//! Dispatch of the per-parameter kernels (SGD, Adam/AdamW, group averaging, DiLoCo's
//! pseudo-gradient) on the device.

use wgpu::util::DeviceExt;

use super::contract::{
    AdamScalars as AdamGpuScalars, BLOCK_ELEMENTS, Dispatch, SgdScalars as SgdGpuScalars,
    adam_flags, scaled_sum_flags, sgd_flags,
};
use super::kernel::Kernel;
use super::{GpuArena, GpuBackend};
use crate::backend::Arena;
use crate::backend::kernels::{self, AdamArenas, AdamScalars, ParamStarts, SgdScalars};
use crate::dtype::StorageFormat;
use crate::error::{Error, Result};

fn flag(on: bool, bit: u32) -> u32 {
    if on { bit } else { 0 }
}

impl GpuBackend {
    fn storage_buffer<T: bytemuck::Pod>(&self, label: &str, items: &[T]) -> wgpu::Buffer {
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
    fn param_table_buffer(&self, starts: &ParamStarts, rank_len: usize) -> wgpu::Buffer {
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
    /// [`Dispatch`] geometry, the parameter table, `launch.tables` and each arena's chunk
    /// (the placeholder for an absent one), bound in that order; one compute pass.
    fn launch(&self, layout: &Arena, starts: &ParamStarts, launch: PerParam<'_>) -> Result<()> {
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
        let pipeline = kernel.pipeline(&self.shared, overrides);
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
                let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("distopt geometry"),
                    contents: bytemuck::bytes_of(&geometry),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                let mut buffers: Vec<&wgpu::Buffer> = vec![&uniform, &starts_buffer];
                buffers.extend_from_slice(tables);
                buffers.extend(
                    arenas
                        .iter()
                        .map(|a| a.map_or(&self.placeholder, |a| &a.chunks[c].buffer)),
                );
                pass.set_bind_group(0, &kernel.bind(device, &buffers), &[]);
                let (x, y) = self.grid(chunk.len / 8 * lanes);
                pass.dispatch_workgroups(x, y, 1);
                first_element += chunk.len;
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
    }

    /// One `u32` flag per entry (1 where set), as a storage buffer.
    fn flags_buffer(&self, label: &str, flags: &[bool]) -> wgpu::Buffer {
        let words: Vec<u32> = flags.iter().map(|&f| u32::from(f)).collect();
        self.storage_buffer(label, &words)
    }

    /// The arena of `arena` if it is given.
    fn gpu_opt<'a>(&self, arena: Option<&'a Arena>) -> Result<Option<&'a GpuArena>> {
        arena.map(|a| self.gpu(a)).transpose()
    }

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
                overrides: &[params.format().shader_code()],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[&table_buffer],
                arenas: &[Some(self.gpu(params)?), Some(self.gpu(grads)?), momentum],
            },
        )
    }

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
            Some(self.gpu(params)?),
            Some(self.gpu(grads)?),
            Some(self.gpu(exp_avg)?),
            Some(self.gpu(exp_avg_sq)?),
            self.gpu_opt(max_exp_avg_sq.as_deref())?,
        ];
        self.launch(
            params,
            starts,
            PerParam {
                kernel: &self.kernels.adam,
                overrides: &[params.format().shader_code()],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[&table_buffer],
                arenas: &arenas,
            },
        )
    }

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
                overrides: &[arena.format().shader_code(), arith.shader_code()],
                lanes: ranks / group_size,
                group_size,
                tables: &[&flags_buffer],
                arenas: &[Some(self.gpu(arena)?)],
            },
        )
    }
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
                overrides: &[params.format().shader_code()],
                lanes: params.ranks(),
                group_size: 0,
                tables: &[&flags_buffer],
                arenas: &[
                    Some(self.gpu(backup)?),
                    Some(self.gpu(params)?),
                    Some(self.gpu(grads)?),
                ],
            },
        )
    }
}

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
                overrides: &[src.format().shader_code(), dst.format().shader_code()],
                lanes: src.ranks(),
                group_size: 0,
                tables: &[&flags_buffer],
                arenas: &[Some(self.gpu(src)?), Some(self.gpu(dst)?)],
            },
        )
    }
}

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
                overrides: &[arena.format().shader_code(), arith.shader_code()],
                // One lane: the kernel sums every rank in a loop.
                lanes: 1,
                group_size: ranks,
                tables: &[&flags_buffer, &scales_buffer, &table_buffer],
                arenas: &[Some(self.gpu(arena)?)],
            },
        )
    }
}

/// What [`GpuBackend::launch`] binds and how it spreads the grid.
struct PerParam<'a> {
    kernel: &'a Kernel,
    /// The values of the kernel's `override` constants, in its spec's order.
    overrides: &'a [u32],
    /// Lanes of the grid per eight elements (ranks, or groups when averaging).
    lanes: usize,
    /// [`Dispatch::group_size`].
    group_size: usize,
    /// The storage buffers bound after the parameter table.
    tables: &'a [&'a wgpu::Buffer],
    /// The arenas bound after the tables, one chunk at a time.
    arenas: &'a [Option<&'a GpuArena>],
}

fn check_geometry(
    what: &str,
    params: &Arena,
    other: &Arena,
    starts: &ParamStarts,
    entries: usize,
) -> Result<()> {
    if params.ranks() != other.ranks()
        || params.rank_len() != other.rank_len()
        || params.chunk_len() != other.chunk_len()
        || params.format() != other.format()
    {
        return Err(Error::value(format!(
            "{what}: arenas do not match ({params:?} vs {other:?})"
        )));
    }
    if starts.0.is_empty() || entries != params.ranks() * starts.0.len() {
        return Err(Error::value(format!(
            "{what}: table has {entries} entries for {} ranks of {} parameters",
            params.ranks(),
            starts.0.len()
        )));
    }
    Ok(())
}
