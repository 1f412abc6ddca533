//! The Rust side of the shader contract, each fact written once: the structs the host writes
//! into buffers (`shader_struct!`) and the constants both sides use (flag bits, table and
//! workgroup sizes, storage-format codes) are defined here and emitted as WGSL declarations
//! ([`Declarations::wgsl`]) in front of the file that owns them, so no shader repeats them.
//!
//! What the WGSL owns, the host reads from it: the libraries a file imports
//! (`// #import name`, resolved by `gpu::assemble`), its bindings, their access and which are
//! packed arenas (`gpu::bindings`, bound by name), and its `override` constants (set by name).

use std::mem::{offset_of, size_of};

use super::shaders;
use crate::dtype::StorageFormat;

/// A Rust type a host-written WGSL struct field may have, with its WGSL spelling (4-byte
/// scalars only, so the Rust `#[repr(C)]` layout is the WGSL one).
pub(crate) trait WgslScalar {
    /// The WGSL type.
    const WGSL: &'static str;
}

impl WgslScalar for u32 {
    const WGSL: &'static str = "u32";
}

impl WgslScalar for f32 {
    const WGSL: &'static str = "f32";
}

/// The layout of a Rust struct that a WGSL struct of the same name mirrors: its size, its
/// named fields (name, byte offset, WGSL type) and the `u32` padding words that follow them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StructSpec {
    pub(crate) wgsl_name: &'static str,
    #[cfg_attr(not(test), allow(dead_code))] // read by the layout test
    pub(crate) size: usize,
    pub(crate) fields: &'static [(&'static str, usize, &'static str)],
    pub(crate) padding_words: usize,
}

/// Defines a `#[repr(C)]` plain-old-data struct that a WGSL struct mirrors, with its
/// [`StructSpec`] (`SPEC`) derived from the Rust definition itself; the WGSL declaration is
/// generated from the spec.
macro_rules! shader_struct {
    (
        $(#[$meta:meta])*
        pub(crate) struct $name:ident as $wgsl:literal {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty,)*
        }
        padding: $pad:ty
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
        pub(crate) struct $name {
            $($(#[$fmeta])* pub(crate) $field: $ty,)*
            /// Padding to the WGSL struct's size.
            pub(crate) _pad: $pad,
        }

        impl $name {
            /// The layout the WGSL declaration is generated from.
            pub(crate) const SPEC: StructSpec = StructSpec {
                wgsl_name: $wgsl,
                size: size_of::<$name>(),
                fields: &[$((
                    stringify!($field),
                    offset_of!($name, $field),
                    <$ty as WgslScalar>::WGSL,
                ),)*],
                padding_words: size_of::<$pad>() / 4,
            };
        }
    };
}

/// Defines `u32` constants and their WGSL declarations (`WGSL`: name and value, emitted as
/// `const NAME: u32 = value;`), in the module it is invoked in.
macro_rules! shader_consts {
    ($($name:ident = $value:expr,)*) => {
        $(
            #[doc = concat!("`", stringify!($name), "` (`", stringify!($value), "`).")]
            pub(crate) const $name: u32 = $value;
        )*
        /// The constants as the WGSL declarations generated from them.
        pub(crate) const WGSL: &[(&str, u32)] = &[$((stringify!($name), $name),)*];
    };
}

shader_struct! {
    /// The uniforms of `shaders/dp_sgd_step.wgsl`.
    pub(crate) struct StepUniforms as "StepUniforms" {
        /// Groups of eight elements in this chunk (per rank).
        octets: u32,
        ranks: u32,
        /// `vec4<u32>` words between consecutive ranks of the parameter chunk.
        param_rank_quads: u32,
        grad_rank_quads: u32,
        learning_rate: f32,
        /// R as f32.
        divisor: f32,
    }
    padding: [u32; 2]
}

shader_struct! {
    /// The dispatch geometry of one arena chunk (`shaders/param_table.wgsl`), the uniform of
    /// every per-parameter kernel.
    pub(crate) struct Dispatch as "Dispatch" {
        /// Groups of eight elements per rank in this chunk.
        octets: u32,
        /// The chunk's first group in the rank's element space.
        first_octet: u32,
        /// `vec4<u32>` words per rank in this chunk.
        rank_quads: u32,
        /// Ranks covered by the grid (optimizers: every rank; averaging: groups).
        ranks: u32,
        /// Parameters in the arena.
        params: u32,
        /// Averaging only.
        group_size: u32,
    }
    padding: [u32; 2]
}

shader_struct! {
    /// One (rank, parameter)'s scalars of `shaders/sgd.wgsl`.
    pub(crate) struct SgdScalars as "SgdScalars" {
        /// [`sgd_flags`] bits.
        flags: u32,
        lr: f32,
        momentum: f32,
        one_minus_dampening: f32,
        weight_decay: f32,
        /// The parameter's first element in PyTorch's scalar tail
        /// (`kernels::SgdScalars::half_tail_from`).
        half_tail_from: u32,
    }
    padding: [u32; 2]
}

shader_struct! {
    /// One (rank, parameter)'s scalars of `shaders/adam.wgsl`.
    pub(crate) struct AdamScalars as "AdamScalars" {
        /// [`adam_flags`] bits.
        flags: u32,
        weight_decay: f32,
        decay_factor: f32,
        one_minus_beta1: f32,
        beta2: f32,
        one_minus_beta2: f32,
        neg_step_size: f32,
        bias_correction2_sqrt: f32,
        eps: f32,
        /// Fused AMSGrad: the parameter's first element in PyTorch's scalar remainder
        /// (`kernels::AdamScalars::remainder_from`); `u32::MAX` for none.
        remainder_from: u32,
        /// The parameter's first element in PyTorch's scalar tail
        /// (`kernels::AdamScalars::half_tail_from`).
        half_tail_from: u32,
    }
    padding: [u32; 1]
}

shader_struct! {
    /// The uniforms of `shaders/copy.wgsl`.
    pub(crate) struct CopyUniforms as "CopyUniforms" {
        /// Groups of eight float32 elements (two `vec4<u32>` words) in this chunk.
        octets: u32,
    }
    padding: [u32; 3]
}

/// The flag bits of [`SgdScalars::flags`].
pub(crate) mod sgd_flags {
    shader_consts! {
        ACTIVE = 1,
        FIRST_STEP = 2,
        NESTEROV = 4,
        MAXIMIZE = 8,
        FUSED = 16,
        FOREACH_MOMENTUM = 32,
    }
}

/// The flag bits of [`AdamScalars::flags`].
pub(crate) mod adam_flags {
    shader_consts! {
        ACTIVE = 1,
        MAXIMIZE = 2,
        AMSGRAD = 4,
        DECOUPLED = 8,
        FUSED = 16,
    }
}

/// The per-(rank, parameter) table bits of `shaders/scaled_sum.wgsl`.
pub(crate) mod scaled_sum_flags {
    shader_consts! {
        CONTRIBUTES = 1,
        RECEIVES = 2,
    }
}

/// Invocations per workgroup in every kernel (`@workgroup_size(WORKGROUP_SIZE)`).
pub(crate) const WORKGROUP_SIZE: u32 = 256;

/// Elements per entry of the parameter table's block index (`shaders/param_table.wgsl`).
pub(crate) const BLOCK_ELEMENTS: usize = 512;

/// The WGSL declarations generated from Rust for one file: constants and struct layouts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Declarations {
    pub(crate) consts: &'static [(&'static str, u32)],
    pub(crate) structs: &'static [StructSpec],
}

impl Declarations {
    /// No generated declarations.
    pub(crate) const NONE: Declarations = Declarations {
        consts: &[],
        structs: &[],
    };

    /// The declarations as WGSL (empty when there are none).
    pub(crate) fn wgsl(&self, file: &str) -> String {
        if self.consts.is_empty() && self.structs.is_empty() {
            return String::new();
        }
        let mut text = format!("// {file}: generated from src/backend/gpu/contract.rs.\n");
        for (name, value) in self.consts {
            text.push_str(&format!("const {name}: u32 = {value}u;\n"));
        }
        for s in self.structs {
            text.push_str(&format!("struct {} {{\n", s.wgsl_name));
            for (field, _, ty) in s.fields {
                text.push_str(&format!("    {field}: {ty},\n"));
            }
            for k in 0..s.padding_words {
                text.push_str(&format!("    _pad{k}: u32,\n"));
            }
            text.push_str("}\n");
        }
        text
    }
}

/// One WGSL file (a kernel or a library it imports) and the declarations the Rust side
/// generates in front of it.
#[derive(Debug)]
pub(crate) struct WgslFile {
    /// The name a `// #import` gives (libraries) or the kernel's label.
    pub(crate) name: &'static str,
    /// The file's text.
    pub(crate) wgsl: &'static str,
    pub(crate) declares: Declarations,
}

/// A kernel: its WGSL file, whose `@compute fn main` is its own or, through `param_table`, the
/// shared one that calls the kernel's `fn run`.
pub(crate) type KernelSpec = WgslFile;

/// Storage formats, exact rounding and the 2-D dispatch grid (`shaders/packing.wgsl`).
pub(crate) const PACKING: WgslFile = WgslFile {
    name: "packing",
    wgsl: shaders::PACKING,
    declares: Declarations {
        consts: &[
            ("FORMAT_F32", StorageFormat::F32.shader_code()),
            ("FORMAT_F16", StorageFormat::F16.shader_code()),
            ("FORMAT_BF16", StorageFormat::BF16.shader_code()),
            ("WORKGROUP_SIZE", WORKGROUP_SIZE),
        ],
        structs: &[],
    },
};

/// The parameter table and the dispatch geometry (`shaders/param_table.wgsl`).
pub(crate) const PARAM_TABLE: WgslFile = WgslFile {
    name: "param_table",
    wgsl: shaders::PARAM_TABLE,
    declares: Declarations {
        consts: &[("BLOCK_ELEMENTS", BLOCK_ELEMENTS as u32)],
        structs: &[Dispatch::SPEC],
    },
};

/// The optimizers' shared arithmetic (`shaders/optim_math.wgsl`).
pub(crate) const OPTIM_MATH: WgslFile = WgslFile {
    name: "optim_math",
    wgsl: shaders::OPTIM_MATH,
    declares: Declarations::NONE,
};

/// Every library a file can `// #import`, by name.
pub(crate) const LIBRARIES: &[&WgslFile] = &[&PACKING, &PARAM_TABLE, &OPTIM_MATH];

/// The synchronous data-parallel SGD step.
pub(crate) const DP_SGD_STEP: KernelSpec = KernelSpec {
    name: "dp_sgd_step",
    wgsl: shaders::DP_SGD_STEP,
    declares: Declarations {
        consts: &[],
        structs: &[StepUniforms::SPEC],
    },
};

/// `torch.optim.SGD`'s step.
pub(crate) const SGD: KernelSpec = KernelSpec {
    name: "sgd",
    wgsl: shaders::SGD,
    declares: Declarations {
        consts: sgd_flags::WGSL,
        structs: &[SgdScalars::SPEC],
    },
};

/// `torch.optim.Adam`/`AdamW`'s step.
pub(crate) const ADAM: KernelSpec = KernelSpec {
    name: "adam",
    wgsl: shaders::ADAM,
    declares: Declarations {
        consts: adam_flags::WGSL,
        structs: &[AdamScalars::SPEC],
    },
};

/// Group averaging.
pub(crate) const AVERAGE: KernelSpec = KernelSpec {
    name: "average",
    wgsl: shaders::AVERAGE,
    declares: Declarations::NONE,
};

/// DDP's gradient all-reduce with joined ranks.
pub(crate) const SCALED_SUM: KernelSpec = KernelSpec {
    name: "scaled_sum",
    wgsl: shaders::SCALED_SUM,
    declares: Declarations {
        consts: scaled_sum_flags::WGSL,
        structs: &[],
    },
};

/// The shader-copy roofline (benchmarks only).
pub(crate) const COPY: KernelSpec = KernelSpec {
    name: "copy",
    wgsl: shaders::COPY,
    declares: Declarations {
        consts: &[],
        structs: &[CopyUniforms::SPEC],
    },
};

/// torch's `lerp_` (Streaming DiLoCo's merge).
pub(crate) const LERP: KernelSpec = KernelSpec {
    name: "lerp",
    wgsl: shaders::LERP,
    declares: Declarations::NONE,
};

/// Storage-format conversion.
pub(crate) const CONVERT: KernelSpec = KernelSpec {
    name: "convert",
    wgsl: shaders::CONVERT,
    declares: Declarations::NONE,
};

/// Every kernel, for validation.
#[allow(dead_code)]
pub(crate) const ALL: &[&KernelSpec] = &[
    &COPY,
    &DP_SGD_STEP,
    &SGD,
    &ADAM,
    &AVERAGE,
    &SCALED_SUM,
    &LERP,
    &CONVERT,
];

#[cfg(test)]
mod tests {
    //! The generated declarations against naga's reading of every assembled module: each
    //! host-written struct has the Rust layout in the shader, and each generated constant is
    //! the Rust value (a shader that also declared one would not parse: WGSL has no
    //! redeclaration).

    use naga::{Module, TypeInner};

    use super::*;
    use crate::backend::gpu::assemble::assemble;

    fn module(spec: &KernelSpec) -> Module {
        let source = assemble(spec, LIBRARIES).expect("assembles").source;
        naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{}: {}", spec.name, e.emit_to_string(&source)))
    }

    fn every_file() -> impl Iterator<Item = &'static WgslFile> {
        LIBRARIES.iter().chain(ALL).copied()
    }

    /// Where `module` declares `spec`'s struct: its layout against the Rust one.
    fn layout_mismatch(spec: &StructSpec, module: &Module) -> Option<String> {
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");
        let (handle, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(spec.wgsl_name))?;
        let TypeInner::Struct { members, .. } = &ty.inner else {
            return Some(format!("{} is not a struct", spec.wgsl_name));
        };
        let shader: Vec<(&str, usize)> = members
            .iter()
            .filter_map(|m| m.name.as_deref().map(|n| (n, m.offset as usize)))
            .filter(|(n, _)| !n.starts_with('_'))
            .collect();
        let host: Vec<(&str, usize)> = spec.fields.iter().map(|f| (f.0, f.1)).collect();
        let size = layouter[handle].size as usize;
        (shader != host || size != spec.size).then(|| {
            format!(
                "struct {}: {shader:?}, {size} bytes in the shader; {host:?}, {} bytes on the host",
                spec.wgsl_name, spec.size
            )
        })
    }

    #[test]
    fn every_generated_struct_has_the_rust_layout_in_the_shader() {
        for file in every_file() {
            for s in file.declares.structs {
                let mut seen = false;
                for kernel in ALL {
                    let module = module(kernel);
                    if module
                        .types
                        .iter()
                        .any(|(_, t)| t.name.as_deref() == Some(s.wgsl_name))
                    {
                        seen = true;
                        assert_eq!(layout_mismatch(s, &module), None, "{}", kernel.name);
                    }
                }
                assert!(seen, "{}: struct {} in no kernel", file.name, s.wgsl_name);
            }
        }
    }

    #[test]
    fn every_generated_constant_has_the_rust_value_in_the_shader() {
        for kernel in ALL {
            let source = assemble(kernel, LIBRARIES).expect("assembles").source;
            let module = module(kernel);
            // The kernel's own declarations and those of the libraries it includes.
            let files = every_file().filter(|f| f.name == kernel.name || source.contains(f.wgsl));
            for file in files {
                for &(name, value) in file.declares.consts {
                    let found = module
                        .constants
                        .iter()
                        .find(|(_, c)| c.name.as_deref() == Some(name))
                        .map(|(_, c)| &module.global_expressions[c.init]);
                    assert!(
                        matches!(
                            found,
                            Some(naga::Expression::Literal(naga::Literal::U32(v))) if *v == value
                        ),
                        "{}: const {name} is {found:?}, {value} on the host",
                        kernel.name
                    );
                }
            }
        }
        // The flags are the kernels' own: SGD's reach sgd.wgsl, and its NESTEROV bit is 4.
        let sgd = module(&SGD);
        assert!(
            sgd.constants
                .iter()
                .any(|(_, c)| c.name.as_deref() == Some("NESTEROV"))
        );
        assert_eq!(sgd_flags::NESTEROV, 4);
    }

    #[test]
    fn a_changed_layout_is_caught() {
        let mut fields = SgdScalars::SPEC.fields.to_vec();
        fields.swap(1, 2);
        let swapped = StructSpec {
            fields: Vec::leak(fields),
            ..SgdScalars::SPEC
        };
        assert!(
            layout_mismatch(&swapped, &module(&SGD))
                .is_some_and(|m| m.contains("struct SgdScalars"))
        );
    }

    #[test]
    fn generated_declarations_read_as_wgsl() {
        let text = SGD.declares.wgsl("sgd");
        assert!(text.contains("const NESTEROV: u32 = 4u;\n"), "{text}");
        assert!(
            text.contains("struct SgdScalars {\n    flags: u32,\n    lr: f32,\n"),
            "{text}"
        );
        assert!(text.contains("    _pad1: u32,\n}\n"), "{text}");
        assert_eq!(AVERAGE.declares.wgsl("average"), "");
    }
}
