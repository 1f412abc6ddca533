//! The WGSL sources, embedded at compile time. Each kernel file is prefixed with the shared
//! `packing.wgsl` (storage formats, rounding, the dispatch grid).

/// Storage formats, exact rounding and the 2-D dispatch grid, shared by every kernel.
pub const PACKING: &str = include_str!("../../../shaders/packing.wgsl");

/// The synchronous data-parallel SGD step (`shaders/dp_sgd_step.wgsl`), ready to compile.
pub const DP_SGD_STEP: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/dp_sgd_step.wgsl")
);

/// `torch.optim.SGD`'s step (`shaders/sgd.wgsl`).
pub const SGD: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/sgd.wgsl")
);

/// `torch.optim.Adam`/`AdamW`'s step (`shaders/adam.wgsl`).
pub const ADAM: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/adam.wgsl")
);

/// Group averaging (`shaders/average.wgsl`).
pub const AVERAGE: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/average.wgsl")
);

/// DDP's gradient all-reduce with joined ranks (`shaders/scaled_sum.wgsl`).
pub const SCALED_SUM: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/scaled_sum.wgsl")
);

/// DiLoCo's pseudo-gradient (`shaders/pseudo_gradient.wgsl`).
pub const PSEUDO_GRADIENT: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/pseudo_gradient.wgsl")
);

/// Storage-format conversion (`shaders/convert.wgsl`).
pub const CONVERT: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/param_table.wgsl"),
    "\n",
    include_str!("../../../shaders/convert.wgsl")
);

/// The shader-copy roofline the benchmarks compare kernels with (`shaders/copy.wgsl`).
pub const COPY: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/copy.wgsl")
);

/// Every complete shader source with its name, for validation.
pub const ALL: &[(&str, &str)] = &[
    ("copy", COPY),
    ("dp_sgd_step", DP_SGD_STEP),
    ("sgd", SGD),
    ("adam", ADAM),
    ("average", AVERAGE),
    ("scaled_sum", SCALED_SUM),
    ("pseudo_gradient", PSEUDO_GRADIENT),
    ("convert", CONVERT),
];

#[cfg(test)]
mod tests {
    //! Every shader parses and validates with naga (the WGSL front end wgpu itself uses), both
    //! as written (with its `override` constants unresolved) and specialised for every storage
    //! format the backend can select, and the shader side of the host/shader contract (override
    //! names, format codes, workgroup size, uniform layout, bindings) matches the Rust side.

    use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
    use naga::{AddressSpace, Expression, Literal, Module, ShaderStage, StorageAccess};

    use super::{ALL, DP_SGD_STEP, PACKING};
    use crate::dtype::StorageFormat;

    /// The formats a kernel's `*FORMAT` override can take on a GPU.
    const GPU_FORMATS: [StorageFormat; 3] =
        [StorageFormat::F32, StorageFormat::F16, StorageFormat::BF16];

    fn parse(name: &str, source: &str) -> Module {
        naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(source)))
    }

    fn validate(name: &str, source: &str, module: &Module) -> ModuleInfo {
        Validator::new(ValidationFlags::all(), Capabilities::default())
            .validate(module)
            .unwrap_or_else(|e| panic!("{name}: validation error:\n{}", e.emit_to_string(source)))
    }

    /// The value of the module-scope `const` named `name`, as a u32.
    fn const_u32(module: &Module, name: &str) -> u32 {
        let (_, constant) = module
            .constants
            .iter()
            .find(|(_, c)| c.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no const {name}"));
        match module.global_expressions[constant.init] {
            Expression::Literal(Literal::U32(v)) => v,
            ref other => panic!("const {name} is not a u32 literal: {other:?}"),
        }
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
        for (name, source) in ALL {
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
        let module = parse("packing", PACKING);
        validate("packing", PACKING, &module);
    }

    /// What wgpu does at pipeline creation on Vulkan: resolve the overrides (naga re-validates
    /// the specialised module) and write SPIR-V, for every format the backend can pick.
    #[test]
    fn every_format_specialisation_validates_and_compiles_to_spirv() {
        for (name, source) in ALL {
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

    #[test]
    fn format_codes_match_the_rust_storage_formats() {
        let module = parse("packing", PACKING);
        assert_eq!(
            const_u32(&module, "FORMAT_F32"),
            StorageFormat::F32.shader_code()
        );
        assert_eq!(
            const_u32(&module, "FORMAT_F16"),
            StorageFormat::F16.shader_code()
        );
        assert_eq!(
            const_u32(&module, "FORMAT_BF16"),
            StorageFormat::BF16.shader_code()
        );
        assert_eq!(
            const_u32(&module, "WORKGROUP_SIZE"),
            super::super::WORKGROUP_SIZE
        );
    }

    #[test]
    fn step_kernel_matches_the_host_side_layout() {
        let module = parse("dp_sgd_step", DP_SGD_STEP);
        let entry = module
            .entry_points
            .iter()
            .find(|e| e.name == "main")
            .expect("entry point main");
        assert_eq!(entry.stage, ShaderStage::Compute);
        assert_eq!(entry.workgroup_size, [super::super::WORKGROUP_SIZE, 1, 1]);

        // The overrides `GpuBackend::pipeline` sets for this kernel.
        let mut overrides: Vec<&str> = module
            .overrides
            .iter()
            .filter_map(|(_, o)| o.name.as_deref())
            .collect();
        overrides.sort_unstable();
        assert_eq!(overrides, ["GRAD_FORMAT", "PARAM_FORMAT"]);

        // The bind group layout `GpuBackend` creates: 0 uniform, 1 read-only storage (grads),
        // 2 and 3 read-write storage (params, means).
        let mut bindings: Vec<(u32, u32, AddressSpace, String)> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                g.binding.as_ref().map(|b| {
                    (
                        b.group,
                        b.binding,
                        g.space,
                        g.name.clone().unwrap_or_default(),
                    )
                })
            })
            .collect();
        bindings.sort_by_key(|b| (b.0, b.1));
        let read = StorageAccess::LOAD;
        let read_write = StorageAccess::LOAD | StorageAccess::STORE;
        let expected = [
            (0, 0, AddressSpace::Uniform, "step"),
            (0, 1, AddressSpace::Storage { access: read }, "grads"),
            (0, 2, AddressSpace::Storage { access: read_write }, "params"),
            (0, 3, AddressSpace::Storage { access: read_write }, "means"),
        ];
        assert_eq!(bindings.len(), expected.len(), "{bindings:?}");
        for (actual, want) in bindings.iter().zip(expected) {
            assert_eq!((actual.0, actual.1, actual.2), (want.0, want.1, want.2));
            assert_eq!(actual.3, want.3);
        }

        // The uniform struct has the size and field order of the host's `StepUniforms`.
        let uniform = module
            .global_variables
            .iter()
            .find(|(_, g)| g.space == AddressSpace::Uniform)
            .map(|(_, g)| g.ty)
            .expect("uniform");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");
        assert_eq!(
            layouter[uniform].size as usize,
            std::mem::size_of::<super::super::StepUniforms>()
        );
        match &module.types[uniform].inner {
            naga::TypeInner::Struct { members, .. } => {
                let fields: Vec<(&str, u32)> = members
                    .iter()
                    .map(|m| (m.name.as_deref().unwrap_or_default(), m.offset))
                    .take(6)
                    .collect();
                assert_eq!(
                    fields,
                    [
                        ("octets", 0),
                        ("ranks", 4),
                        ("param_rank_quads", 8),
                        ("grad_rank_quads", 12),
                        ("learning_rate", 16),
                        ("divisor", 20),
                    ]
                );
            }
            other => panic!("uniform is not a struct: {other:?}"),
        }
    }
}
