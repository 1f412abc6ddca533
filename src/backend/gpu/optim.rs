//! Dispatch of the per-parameter kernels (SGD, Adam/AdamW, group averaging, DiLoCo's
//! pseudo-gradient) on the device.

use wgpu::util::DeviceExt;

use super::GpuBackend;
use super::contract::{
    AdamScalars as AdamGpuScalars, BLOCK_ELEMENTS, Dispatch, SgdScalars as SgdGpuScalars,
    adam_flags, scaled_sum_flags, sgd_flags,
};
use crate::backend::Arena;
use crate::backend::kernels::{AdamArenas, AdamScalars, ParamStarts, SgdScalars};
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

    /// Records one dispatch per chunk of `arena`: `bind(chunk index, geometry buffer)` returns
    /// the bind group; `lanes` is the grid's second factor (ranks, or groups).
    fn dispatch_chunks(
        &self,
        pipeline: &wgpu::ComputePipeline,
        arena: &Arena,
        lanes: usize,
        params: usize,
        group_size: usize,
        bind: &dyn Fn(usize, &wgpu::Buffer) -> wgpu::BindGroup,
    ) -> Result<()> {
        let gpu = self.gpu(arena)?;
        let device = &self.shared.device;
        let mut encoder = device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(pipeline);
            let mut first_element = 0usize;
            for (c, chunk) in gpu.chunks.iter().enumerate() {
                let geometry = Dispatch {
                    // Chunks hold whole 64-element parameter slots: eight-element groups and
                    // whole vec4<u32> words per rank.
                    octets: (chunk.len / 8) as u32,
                    first_octet: (first_element / 8) as u32,
                    rank_quads: (chunk.rank_words / 4) as u32,
                    ranks: lanes as u32,
                    params: params as u32,
                    group_size: group_size as u32,
                    _pad: [0; 2],
                };
                let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("distopt geometry"),
                    contents: bytemuck::bytes_of(&geometry),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
                let bind_group = bind(c, &uniform);
                pass.set_bind_group(0, &bind_group, &[]);
                let (x, y) = self.grid(chunk.len / 8 * lanes);
                pass.dispatch_workgroups(x, y, 1);
                first_element += chunk.len;
            }
        }
        self.shared.queue.submit([encoder.finish()]);
        self.shared.take_uncaptured()
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
        let table: Vec<SgdGpuScalars> = scalars
            .iter()
            .map(|s| SgdGpuScalars {
                flags: flag(s.active, sgd_flags::ACTIVE)
                    | flag(s.first_step, sgd_flags::FIRST_STEP)
                    | flag(s.nesterov, sgd_flags::NESTEROV)
                    | flag(s.maximize, sgd_flags::MAXIMIZE),
                lr: s.lr as f32,
                momentum: s.momentum as f32,
                one_minus_dampening: s.one_minus_dampening as f32,
                weight_decay: s.weight_decay as f32,
                _pad: [0; 3],
            })
            .collect();
        let starts_buffer = self.param_table_buffer(starts, params.rank_len());
        let table_buffer = self.storage_buffer("distopt sgd scalars", &table);
        let kernel = &self.kernels.sgd;
        let pipeline = kernel.pipeline(&self.shared, &[params.format().shader_code()]);
        let (p, g) = (self.gpu(params)?, self.gpu(grads)?);
        let m = match &momentum {
            Some(m) => Some(self.gpu(m)?),
            None => None,
        };
        let device = &self.shared.device;
        self.dispatch_chunks(
            &pipeline,
            params,
            params.ranks(),
            starts.0.len(),
            0,
            &|c, uniform| {
                let momentum_buffer = m.map_or(&self.placeholder, |m| &m.chunks[c].buffer);
                kernel.bind(
                    device,
                    &[
                        uniform,
                        &starts_buffer,
                        &table_buffer,
                        &p.chunks[c].buffer,
                        &g.chunks[c].buffer,
                        momentum_buffer,
                    ],
                )
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
        let table: Vec<AdamGpuScalars> = scalars
            .iter()
            .map(|s| AdamGpuScalars {
                flags: flag(s.active, adam_flags::ACTIVE)
                    | flag(s.maximize, adam_flags::MAXIMIZE)
                    | flag(s.amsgrad, adam_flags::AMSGRAD)
                    | flag(s.decoupled, adam_flags::DECOUPLED),
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
        let starts_buffer = self.param_table_buffer(starts, params.rank_len());
        let table_buffer = self.storage_buffer("distopt adam scalars", &table);
        let kernel = &self.kernels.adam;
        let pipeline = kernel.pipeline(&self.shared, &[params.format().shader_code()]);
        let (p, g) = (self.gpu(params)?, self.gpu(grads)?);
        let (m, v) = (self.gpu(exp_avg)?, self.gpu(exp_avg_sq)?);
        let vmax = match &max_exp_avg_sq {
            Some(x) => Some(self.gpu(x)?),
            None => None,
        };
        let device = &self.shared.device;
        self.dispatch_chunks(
            &pipeline,
            params,
            params.ranks(),
            starts.0.len(),
            0,
            &|c, uniform| {
                let vmax_buffer = vmax.map_or(&self.placeholder, |x| &x.chunks[c].buffer);
                kernel.bind(
                    device,
                    &[
                        uniform,
                        &starts_buffer,
                        &table_buffer,
                        &p.chunks[c].buffer,
                        &g.chunks[c].buffer,
                        &m.chunks[c].buffer,
                        &v.chunks[c].buffer,
                        vmax_buffer,
                    ],
                )
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
        let flags: Vec<u32> = active.iter().map(|&a| u32::from(a)).collect();
        let starts_buffer = self.param_table_buffer(starts, arena.rank_len());
        let flags_buffer = self.storage_buffer("distopt average flags", &flags);
        let kernel = &self.kernels.average;
        let pipeline = kernel.pipeline(
            &self.shared,
            &[arena.format().shader_code(), arith.shader_code()],
        );
        let a = self.gpu(arena)?;
        let device = &self.shared.device;
        self.dispatch_chunks(
            &pipeline,
            arena,
            ranks / group_size,
            starts.0.len(),
            group_size,
            &|c, uniform| {
                kernel.bind(
                    device,
                    &[uniform, &starts_buffer, &flags_buffer, &a.chunks[c].buffer],
                )
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
        let flags: Vec<u32> = active.iter().map(|&a| u32::from(a)).collect();
        let starts_buffer = self.param_table_buffer(starts, params.rank_len());
        let flags_buffer = self.storage_buffer("distopt pseudo_gradient flags", &flags);
        let kernel = &self.kernels.pseudo_gradient;
        let pipeline = kernel.pipeline(&self.shared, &[params.format().shader_code()]);
        let (p, o, g) = (self.gpu(params)?, self.gpu(backup)?, self.gpu(grads)?);
        let device = &self.shared.device;
        self.dispatch_chunks(
            &pipeline,
            params,
            params.ranks(),
            starts.0.len(),
            0,
            &|c, uniform| {
                kernel.bind(
                    device,
                    &[
                        uniform,
                        &starts_buffer,
                        &flags_buffer,
                        &o.chunks[c].buffer,
                        &p.chunks[c].buffer,
                        &g.chunks[c].buffer,
                    ],
                )
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
        let flags: Vec<u32> = active.iter().map(|&a| u32::from(a)).collect();
        let starts_buffer = self.param_table_buffer(starts, src.rank_len());
        let flags_buffer = self.storage_buffer("distopt convert flags", &flags);
        let kernel = &self.kernels.convert;
        let pipeline = kernel.pipeline(
            &self.shared,
            &[src.format().shader_code(), dst.format().shader_code()],
        );
        let (s, d) = (self.gpu(src)?, self.gpu(dst)?);
        let device = &self.shared.device;
        self.dispatch_chunks(
            &pipeline,
            src,
            src.ranks(),
            starts.0.len(),
            0,
            &|c, uniform| {
                kernel.bind(
                    device,
                    &[
                        uniform,
                        &starts_buffer,
                        &flags_buffer,
                        &s.chunks[c].buffer,
                        &d.chunks[c].buffer,
                    ],
                )
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
        let flags: Vec<u32> = reduced.iter().map(|&r| u32::from(r)).collect();
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
        let starts_buffer = self.param_table_buffer(starts, arena.rank_len());
        let flags_buffer = self.storage_buffer("distopt scaled sum flags", &flags);
        let scales_buffer = self.storage_buffer("distopt scaled sum scales", &scale_values);
        let table_buffer = self.storage_buffer("distopt scaled sum table", &table);
        let kernel = &self.kernels.scaled_sum;
        let pipeline = kernel.pipeline(
            &self.shared,
            &[arena.format().shader_code(), arith.shader_code()],
        );
        let a = self.gpu(arena)?;
        let device = &self.shared.device;
        self.dispatch_chunks(&pipeline, arena, 1, params, ranks, &|c, uniform| {
            kernel.bind(
                device,
                &[
                    uniform,
                    &starts_buffer,
                    &flags_buffer,
                    &scales_buffer,
                    &table_buffer,
                    &a.chunks[c].buffer,
                ],
            )
        })
    }
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
