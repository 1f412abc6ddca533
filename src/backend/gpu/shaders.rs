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

/// Every complete shader source with its name, for validation.
pub const ALL: &[(&str, &str)] = &[
    ("dp_sgd_step", DP_SGD_STEP),
    ("sgd", SGD),
    ("adam", ADAM),
    ("average", AVERAGE),
];

#[cfg(test)]
mod tests {
    //! Every shader parses and validates with naga (the WGSL front end wgpu itself uses), both
    //! as written (with its `override` constants unresolved) and specialised for every pair of
    //! storage formats the backend can ask for, and the shader side of the host/shader
    //! contract (override names, format codes, workgroup size, uniform layout, bindings)
    //! matches the Rust side.

    use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
    use naga::{AddressSpace, Expression, Literal, Module, ShaderStage, StorageAccess};

    use super::{ALL, DP_SGD_STEP, PACKING};
    use crate::dtype::StorageFormat;

    const FORMATS: [StorageFormat; 3] =
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
                    .any(|e| e.stage == ShaderStage::Compute && e.name == "main"),
                "{name}: no compute entry point `main`"
            );
        }
    }

    #[test]
    fn packing_library_parses_and_validates_alone() {
        let module = parse("packing", PACKING);
        validate("packing", PACKING, &module);
    }

    #[test]
    fn every_format_specialisation_validates_and_compiles_to_spirv() {
        for (name, source) in ALL {
            let module = parse(name, source);
            let info = validate(name, source, &module);
            let overrides: Vec<&str> = module
                .overrides
                .iter()
                .filter_map(|(_, o)| o.name.as_deref())
                .collect();
            // Every combination of storage formats over the shader's overrides (the backend
            // sets each of them to a format code: PARAM_FORMAT/GRAD_FORMAT, FORMAT/ARITH).
            assert!(!overrides.is_empty(), "{name}: no override constants");
            let combinations = FORMATS.len().pow(overrides.len() as u32);
            for combination in 0..combinations {
                let mut constants = naga::back::PipelineConstants::default();
                let mut rest = combination;
                for key in &overrides {
                    let format = FORMATS[rest % FORMATS.len()];
                    rest /= FORMATS.len();
                    constants.insert((*key).into(), f64::from(format.shader_code()));
                }
                let what = format!("{name} ({constants:?})");
                // process_overrides re-validates the specialised module.
                let (resolved, resolved_info) = naga::back::pipeline_constants::process_overrides(
                    &module,
                    &info,
                    Some((ShaderStage::Compute, "main")),
                    &constants,
                )
                .unwrap_or_else(|e| panic!("{what}: overrides: {e}"));
                let spirv = naga::back::spv::write_vec(
                    &resolved,
                    &resolved_info,
                    &naga::back::spv::Options::default(),
                    Some(&naga::back::spv::PipelineOptions {
                        shader_stage: ShaderStage::Compute,
                        entry_point: "main".into(),
                    }),
                )
                .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
                assert_eq!(spirv.first(), Some(&0x0723_0203), "{what}: SPIR-V magic");
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
        assert_eq!(entry.workgroup_size, [super::super::WORKGROUP_SIZE, 1, 1]);

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

        // The uniform struct has the size of the host's `StepUniforms`.
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
                let names: Vec<&str> = members.iter().filter_map(|m| m.name.as_deref()).collect();
                assert_eq!(
                    &names[..6],
                    [
                        "pairs",
                        "ranks",
                        "param_rank_words",
                        "grad_rank_words",
                        "learning_rate",
                        "divisor"
                    ]
                );
                let offsets: Vec<u32> = members.iter().map(|m| m.offset).collect();
                assert_eq!(&offsets[..6], [0, 4, 8, 12, 16, 20]);
            }
            other => panic!("uniform is not a struct: {other:?}"),
        }
    }
}
