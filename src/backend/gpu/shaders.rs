//! The WGSL sources, embedded at compile time: the shared libraries (storage formats and the
//! dispatch grid; the parameter table; the optimizers' arithmetic) and each kernel's own file.
//! A kernel's complete module is assembled by `gpu::assemble`: the libraries its file
//! `// #import`s, the declarations generated from `gpu::contract`, the arena accessors.

/// Storage formats, exact rounding and the 2-D dispatch grid, shared by every kernel.
pub const PACKING: &str = include_str!("../../../shaders/packing.wgsl");

/// The parameter table and the dispatch geometry of the per-parameter kernels.
pub const PARAM_TABLE: &str = include_str!("../../../shaders/param_table.wgsl");

/// The arithmetic the optimizer kernels share (`shaders/optim_math.wgsl`): per-operation
/// rounding, PyTorch's `add(alpha=)` and the single-rounded multiply-add of `fused=True`.
pub const OPTIM_MATH: &str = include_str!("../../../shaders/optim_math.wgsl");

/// The synchronous data-parallel SGD step (`shaders/dp_sgd_step.wgsl`).
pub const DP_SGD_STEP: &str = include_str!("../../../shaders/dp_sgd_step.wgsl");

/// `torch.optim.SGD`'s step (`shaders/sgd.wgsl`).
pub const SGD: &str = include_str!("../../../shaders/sgd.wgsl");

/// `torch.optim.Adam`/`AdamW`'s step (`shaders/adam.wgsl`).
pub const ADAM: &str = include_str!("../../../shaders/adam.wgsl");

/// Group averaging (`shaders/average.wgsl`).
pub const AVERAGE: &str = include_str!("../../../shaders/average.wgsl");

/// DDP's gradient all-reduce with joined ranks (`shaders/scaled_sum.wgsl`).
pub const SCALED_SUM: &str = include_str!("../../../shaders/scaled_sum.wgsl");

/// torch's `lerp_`, Streaming DiLoCo's merge (`shaders/lerp.wgsl`).
pub const LERP: &str = include_str!("../../../shaders/lerp.wgsl");

/// Storage-format conversion (`shaders/convert.wgsl`).
pub const CONVERT: &str = include_str!("../../../shaders/convert.wgsl");

/// The shader-copy roofline the benchmarks compare kernels with (`shaders/copy.wgsl`).
pub const COPY: &str = include_str!("../../../shaders/copy.wgsl");

#[cfg(test)]
mod tests {
    //! Every shader parses and validates with naga (the WGSL front end wgpu itself uses), both
    //! as assembled (with its `override` constants unresolved, the declarations generated from
    //! the Rust side included) and specialised for every storage format the backend can select.

    use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
    use naga::{Expression, Module, ShaderStage};

    use crate::backend::gpu::assemble::assemble;
    use crate::backend::gpu::contract::{ALL, KernelSpec, LIBRARIES, PACKING};
    use crate::dtype::StorageFormat;

    /// The formats a kernel's `*FORMAT` override can take on a GPU.
    const GPU_FORMATS: [StorageFormat; 3] =
        [StorageFormat::F32, StorageFormat::F16, StorageFormat::BF16];

    fn source(spec: &KernelSpec) -> String {
        assemble(spec, LIBRARIES)
            .unwrap_or_else(|e| panic!("{e}"))
            .source
    }

    fn parse(name: &str, source: &str) -> Module {
        naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(source)))
    }

    fn validate(name: &str, source: &str, module: &Module) -> ModuleInfo {
        Validator::new(ValidationFlags::all(), Capabilities::default())
            .validate(module)
            .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(source)))
    }

    /// Every assignment of GPU format codes to the module's `*FORMAT` overrides (the other
    /// overrides keep their defaults).
    fn format_assignments(module: &Module) -> Vec<naga::back::PipelineConstants> {
        let names: Vec<String> = module
            .overrides
            .iter()
            .filter_map(|(_, o)| o.name.clone())
            .filter(|n| n.ends_with("FORMAT"))
            .collect();
        let mut out = vec![naga::back::PipelineConstants::default()];
        for name in &names {
            let mut next = Vec::new();
            for partial in &out {
                for format in GPU_FORMATS {
                    let mut constants = partial.clone();
                    constants.insert(name.clone(), f64::from(format.shader_code()));
                    next.push(constants);
                }
            }
            out = next;
        }
        out
    }

    #[test]
    fn every_shader_parses_and_validates_as_written() {
        assert!(!ALL.is_empty());
        for spec in ALL {
            let (name, source) = (spec.name, &source(spec));
            let module = parse(name, source);
            validate(name, source, &module);
            assert!(
                module
                    .entry_points
                    .iter()
                    .any(|e| e.stage == ShaderStage::Compute),
                "{name}: no compute entry point"
            );
        }
    }

    #[test]
    fn packing_library_parses_and_validates_alone() {
        let packing = source(&PACKING);
        let module = parse("packing", &packing);
        validate("packing", &packing, &module);
    }

    /// What wgpu does at pipeline creation on Vulkan: resolve the overrides (naga re-validates
    /// the specialised module) and write SPIR-V, for every format the backend can pick.
    #[test]
    fn every_format_specialisation_validates_and_compiles_to_spirv() {
        for spec in ALL {
            let (name, source) = (spec.name, &source(spec));
            let module = parse(name, source);
            let info = validate(name, source, &module);
            let assignments = format_assignments(&module);
            for entry in module
                .entry_points
                .iter()
                .filter(|e| e.stage == ShaderStage::Compute)
            {
                for constants in &assignments {
                    let what = format!("{name}::{} with {constants:?}", entry.name);
                    let (resolved, resolved_info) =
                        naga::back::pipeline_constants::process_overrides(
                            &module,
                            &info,
                            Some((ShaderStage::Compute, entry.name.as_str())),
                            constants,
                        )
                        .unwrap_or_else(|e| panic!("{what}: overrides: {e}"));
                    // Every use of an override now refers to a constant (naga keeps the
                    // overrides arena itself, but nothing refers to it any more).
                    assert!(
                        !resolved
                            .global_expressions
                            .iter()
                            .any(|(_, e)| matches!(e, Expression::Override(_))),
                        "{what}: unresolved overrides"
                    );
                    let spirv = naga::back::spv::write_vec(
                        &resolved,
                        &resolved_info,
                        &naga::back::spv::Options::default(),
                        Some(&naga::back::spv::PipelineOptions {
                            shader_stage: ShaderStage::Compute,
                            entry_point: entry.name.clone(),
                        }),
                    )
                    .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
                    assert_eq!(spirv.first(), Some(&0x0723_0203), "{what}: SPIR-V magic");
                }
            }
        }
    }
}
