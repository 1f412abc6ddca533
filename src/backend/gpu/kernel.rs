//! One compute kernel family: a shader module, its bind group layout (built from the bindings
//! the shader declares), and the pipelines specialised by `override` constants, created on
//! first use and cached. Buffers are bound, and overrides set, by the names the shader gives
//! them.

use std::collections::HashMap;
use std::sync::Mutex;

use super::assemble::{ShaderError, assemble};
use super::bindings::{Access, Bindings};
use super::contract::{KernelSpec, LIBRARIES};
use super::shared::GpuShared;

pub(crate) struct Kernel {
    name: &'static str,
    module: wgpu::ShaderModule,
    pub(crate) layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    bindings: Bindings,
    /// The names of the shader's `override` constants, in declaration order.
    overrides: Vec<String>,
    pipelines: Mutex<HashMap<Vec<u32>, wgpu::ComputePipeline>>,
}

impl Kernel {
    /// The kernel `spec` describes: its module (the assembled WGSL), its bind group layout
    /// and its pipeline layout.
    ///
    /// # Errors
    /// A [`ShaderError`] when its WGSL cannot be assembled (an unknown or duplicate import, an
    /// unreadable binding).
    pub(crate) fn new(
        device: &wgpu::Device,
        spec: &'static KernelSpec,
    ) -> Result<Kernel, ShaderError> {
        let name = spec.name;
        let assembled = assemble(spec, LIBRARIES)?;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(assembled.source.into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = assembled
            .bindings
            .iter()
            .map(|b| wgpu::BindGroupLayoutEntry {
                binding: b.number,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match b.access {
                        Access::Uniform => wgpu::BufferBindingType::Uniform,
                        Access::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Access::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
                    },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(name),
            entries: &entries,
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        Ok(Kernel {
            name,
            module,
            layout,
            pipeline_layout,
            bindings: assembled.bindings,
            overrides: assembled.overrides,
            pipelines: Mutex::new(HashMap::new()),
        })
    }

    /// The pipeline specialised for `values` of the override constants, by name (cached).
    ///
    /// # Errors
    /// A [`ShaderError`] unless `values` names each of the shader's overrides once.
    pub(crate) fn pipeline(
        &self,
        shared: &GpuShared,
        values: &[(&str, u32)],
    ) -> Result<wgpu::ComputePipeline, ShaderError> {
        let ordered: Option<Vec<u32>> = self
            .overrides
            .iter()
            .map(|name| values.iter().find(|(n, _)| n == name).map(|&(_, v)| v))
            .collect();
        let ordered = ordered
            .filter(|_| values.len() == self.overrides.len())
            .ok_or_else(|| ShaderError::Overrides {
                kernel: self.name.into(),
                given: values.iter().map(|(n, _)| n.to_string()).collect(),
                declared: self.overrides.clone(),
            })?;
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        Ok(cache
            .entry(ordered)
            .or_insert_with_key(|ordered| {
                let constants: Vec<(&str, f64)> = self
                    .overrides
                    .iter()
                    .zip(ordered)
                    .map(|(name, &v)| (name.as_str(), f64::from(v)))
                    .collect();
                shared
                    .device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(self.name),
                        layout: Some(&self.pipeline_layout),
                        module: &self.module,
                        entry_point: Some("main"),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &constants,
                            zero_initialize_workgroup_memory: false,
                        },
                        cache: None,
                    })
            })
            .clone())
    }

    /// Pipelines created so far.
    pub(crate) fn cached(&self) -> usize {
        self.pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// A bind group of `buffers`, each bound to the binding of its name.
    ///
    /// # Errors
    /// A [`ShaderError`] unless `buffers` names each of the shader's bindings once.
    pub(crate) fn bind(
        &self,
        device: &wgpu::Device,
        buffers: &[(&str, &wgpu::Buffer)],
    ) -> Result<wgpu::BindGroup, ShaderError> {
        let entries: Vec<wgpu::BindGroupEntry> = self
            .bindings
            .resolve(buffers)?
            .into_iter()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        Ok(device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.name),
            layout: &self.layout,
            entries: &entries,
        }))
    }
}
