//! One compute kernel family: a shader module, its explicit bind group layout, and the
//! pipelines specialised by `override` constants, created on first use and cached.

use std::collections::HashMap;
use std::sync::Mutex;

use super::GpuShared;
use super::contract::{Binding, KernelSpec};

pub(crate) struct Kernel {
    name: &'static str,
    module: wgpu::ShaderModule,
    pub(crate) layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    /// The names of the shader's `override` constants, in the order values are given.
    constants: &'static [&'static str],
    pipelines: Mutex<HashMap<Vec<u32>, wgpu::ComputePipeline>>,
}

impl Kernel {
    /// The kernel `spec` describes: its module (the assembled WGSL), its bind group layout
    /// and its pipeline layout.
    pub(crate) fn new(device: &wgpu::Device, spec: &'static KernelSpec) -> Kernel {
        let name = spec.name;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(spec.source().into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = spec
            .bindings
            .iter()
            .map(|b| b.kind)
            .enumerate()
            .map(|(i, binding)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: match binding {
                        Binding::Uniform => wgpu::BufferBindingType::Uniform,
                        Binding::Read => wgpu::BufferBindingType::Storage { read_only: true },
                        Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
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
        Kernel {
            name,
            module,
            layout,
            pipeline_layout,
            constants: spec.overrides,
            pipelines: Mutex::new(HashMap::new()),
        }
    }

    /// The pipeline specialised for `values` of the override constants (cached).
    pub(crate) fn pipeline(&self, shared: &GpuShared, values: &[u32]) -> wgpu::ComputePipeline {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(values.to_vec())
            .or_insert_with(|| {
                let constants: Vec<(&str, f64)> = self
                    .constants
                    .iter()
                    .zip(values)
                    .map(|(name, &v)| (*name, f64::from(v)))
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
            .clone()
    }

    /// Pipelines created so far.
    pub(crate) fn cached(&self) -> usize {
        self.pipelines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// A bind group of `buffers`, in binding order.
    pub(crate) fn bind(&self, device: &wgpu::Device, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry> = buffers
            .iter()
            .enumerate()
            .map(|(i, buffer)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(self.name),
            layout: &self.layout,
            entries: &entries,
        })
    }
}
