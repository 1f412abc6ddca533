//! The host side of the shader contract, in one place: for every kernel, its WGSL source, its
//! bindings (number, name, access), its `override` constants, the Rust twins of the structs it
//! reads from buffers, and the constants both sides use (flag bits, table and workgroup sizes,
//! storage-format codes).
//!
//! The WGSL files hold the arithmetic; everything the host must agree with is declared here
//! and checked against the shaders by reflection (naga): `tests::every_kernel_matches_its_spec`
//! fails on any binding, struct field, override or constant changed on one side only. The
//! per-binding load/store helpers of the packed arenas are generated from the binding list
//! ([`KernelSpec::source`]), so a kernel's WGSL never repeats them.

use std::mem::{offset_of, size_of};

use super::shaders;
use crate::dtype::StorageFormat;

/// How a binding is used by the shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

/// Which helpers [`KernelSpec::source`] generates for an arena binding
/// (`array<vec4<u32>>` in a storage format): `load_<name>(base, octet) -> Eight`, and with
/// `store`, `store_<name>(base, octet, value)`. `format` names the WGSL override (or constant)
/// that holds the arena's storage format.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Accessors {
    pub(crate) format: &'static str,
    pub(crate) store: bool,
}

/// One binding of a kernel's bind group 0, in binding order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BindingSpec {
    pub(crate) name: &'static str,
    pub(crate) kind: Binding,
    pub(crate) accessors: Option<Accessors>,
}

const fn uniform(name: &'static str) -> BindingSpec {
    BindingSpec {
        name,
        kind: Binding::Uniform,
        accessors: None,
    }
}

const fn read(name: &'static str) -> BindingSpec {
    BindingSpec {
        name,
        kind: Binding::Read,
        accessors: None,
    }
}

const fn read_write(name: &'static str) -> BindingSpec {
    BindingSpec {
        name,
        kind: Binding::ReadWrite,
        accessors: None,
    }
}

/// A read-only arena with a generated `load_<name>`.
const fn arena_in(name: &'static str, format: &'static str) -> BindingSpec {
    BindingSpec {
        name,
        kind: Binding::Read,
        accessors: Some(Accessors {
            format,
            store: false,
        }),
    }
}

/// A read-write arena with generated `load_<name>` and `store_<name>`.
const fn arena_inout(name: &'static str, format: &'static str) -> BindingSpec {
    BindingSpec {
        name,
        kind: Binding::ReadWrite,
        accessors: Some(Accessors {
            format,
            store: true,
        }),
    }
}

/// The layout of a Rust struct that mirrors a WGSL struct: its WGSL name, its size and its
/// named fields with their byte offsets (padding fields, named `_…`, are left out; the size
/// covers them).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))] // read by the reflection test
pub(crate) struct StructSpec {
    pub(crate) wgsl_name: &'static str,
    pub(crate) size: usize,
    pub(crate) fields: &'static [(&'static str, usize)],
}

/// Defines a `#[repr(C)]` plain-old-data struct that mirrors a WGSL struct, with its
/// [`StructSpec`] (`SPEC`) derived from the Rust definition itself.
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
            /// The layout the shader must agree with.
            #[allow(dead_code)]
            pub(crate) const SPEC: StructSpec = StructSpec {
                wgsl_name: $wgsl,
                size: size_of::<$name>(),
                fields: &[$((stringify!($field), offset_of!($name, $field)),)*],
            };
        }
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
    }
    padding: [u32; 3]
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
    }
    padding: [u32; 3]
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
    pub(crate) const ACTIVE: u32 = 1;
    pub(crate) const FIRST_STEP: u32 = 2;
    pub(crate) const NESTEROV: u32 = 4;
    pub(crate) const MAXIMIZE: u32 = 8;
    pub(crate) const FUSED: u32 = 16;
}

/// The flag bits of [`AdamScalars::flags`].
pub(crate) mod adam_flags {
    pub(crate) const ACTIVE: u32 = 1;
    pub(crate) const MAXIMIZE: u32 = 2;
    pub(crate) const AMSGRAD: u32 = 4;
    pub(crate) const DECOUPLED: u32 = 8;
    pub(crate) const FUSED: u32 = 16;
}

/// The per-(rank, parameter) table bits of `shaders/scaled_sum.wgsl`.
pub(crate) mod scaled_sum_flags {
    pub(crate) const CONTRIBUTES: u32 = 1;
    pub(crate) const RECEIVES: u32 = 2;
}

/// Invocations per workgroup in every kernel.
pub(crate) const WORKGROUP_SIZE: u32 = 256;

/// Elements per entry of the parameter table's block index (`shaders/param_table.wgsl`).
pub(crate) const BLOCK_ELEMENTS: usize = 512;

/// A compute kernel as the host sees it.
#[derive(Debug)]
pub(crate) struct KernelSpec {
    pub(crate) name: &'static str,
    /// The shared WGSL the kernel builds on (storage formats, the parameter table), in order.
    pub(crate) prelude: &'static [&'static str],
    /// The kernel's own WGSL.
    pub(crate) body: &'static str,
    pub(crate) bindings: &'static [BindingSpec],
    /// The `override` constants, in the order the host gives values.
    pub(crate) overrides: &'static [&'static str],
    /// Structs the kernel reads whose layout the host writes.
    #[cfg_attr(not(test), allow(dead_code))] // read by the reflection test
    pub(crate) structs: &'static [StructSpec],
    /// WGSL constants the host relies on, with the host's value.
    #[cfg_attr(not(test), allow(dead_code))] // read by the reflection test
    pub(crate) constants: &'static [(&'static str, u32)],
}

impl KernelSpec {
    /// The complete WGSL: the prelude, the generated arena accessors, the kernel.
    pub(crate) fn source(&self) -> String {
        let mut source = String::new();
        for part in self.prelude {
            source.push_str(part);
            source.push('\n');
        }
        source.push_str(self.body);
        source.push('\n');
        for binding in self.bindings {
            if let Some(a) = binding.accessors {
                source.push_str(&accessors(binding.name, a));
            }
        }
        source
    }
}

/// `load_<name>`/`store_<name>` for an arena binding: eight elements at `octet` of the rank
/// whose first `vec4<u32>` word is `base`, as two words (float32) or one packed word quad.
fn accessors(name: &str, a: Accessors) -> String {
    let format = a.format;
    let mut text = format!(
        "\nfn load_{name}(base: u32, octet: u32) -> Eight {{\n    \
         if ({format} == FORMAT_F32) {{\n        \
         return Eight(bitcast<vec4<f32>>({name}[base + 2u * octet]), bitcast<vec4<f32>>({name}[base + 2u * octet + 1u]));\n    \
         }}\n    \
         return unpack_eight({format}, {name}[base + octet]);\n}}\n"
    );
    if a.store {
        text.push_str(&format!(
            "\nfn store_{name}(base: u32, octet: u32, value: Eight) {{\n    \
             if ({format} == FORMAT_F32) {{\n        \
             {name}[base + 2u * octet] = bitcast<vec4<u32>>(value.lo);\n        \
             {name}[base + 2u * octet + 1u] = bitcast<vec4<u32>>(value.hi);\n    \
             }} else {{\n        \
             {name}[base + octet] = pack_eight({format}, value);\n    \
             }}\n}}\n"
        ));
    }
    text
}

const FORMAT_CONSTANTS: &[(&str, u32)] = &[
    ("FORMAT_F32", StorageFormat::F32.shader_code()),
    ("FORMAT_F16", StorageFormat::F16.shader_code()),
    ("FORMAT_BF16", StorageFormat::BF16.shader_code()),
    ("WORKGROUP_SIZE", WORKGROUP_SIZE),
];

const TABLE_CONSTANTS: &[(&str, u32)] = &[
    ("FORMAT_F32", StorageFormat::F32.shader_code()),
    ("FORMAT_F16", StorageFormat::F16.shader_code()),
    ("FORMAT_BF16", StorageFormat::BF16.shader_code()),
    ("WORKGROUP_SIZE", WORKGROUP_SIZE),
    ("BLOCK_ELEMENTS", BLOCK_ELEMENTS as u32),
];

/// The synchronous data-parallel SGD step.
pub(crate) const DP_SGD_STEP: KernelSpec = KernelSpec {
    name: "dp_sgd_step",
    prelude: &[shaders::PACKING],
    body: shaders::DP_SGD_STEP,
    bindings: &[
        uniform("step"),
        arena_in("grads", "GRAD_FORMAT"),
        arena_inout("params", "PARAM_FORMAT"),
        read_write("means"),
    ],
    overrides: &["PARAM_FORMAT", "GRAD_FORMAT"],
    structs: &[StepUniforms::SPEC],
    constants: FORMAT_CONSTANTS,
};

/// `torch.optim.SGD`'s step.
pub(crate) const SGD: KernelSpec = KernelSpec {
    name: "sgd",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE, shaders::OPTIM_MATH],
    body: shaders::SGD,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("scalars"),
        arena_inout("params", "FORMAT"),
        arena_in("grads", "FORMAT"),
        arena_inout("momentum", "FORMAT"),
    ],
    overrides: &["FORMAT"],
    structs: &[Dispatch::SPEC, SgdScalars::SPEC],
    constants: &[
        ("BLOCK_ELEMENTS", BLOCK_ELEMENTS as u32),
        ("ACTIVE", sgd_flags::ACTIVE),
        ("FIRST_STEP", sgd_flags::FIRST_STEP),
        ("NESTEROV", sgd_flags::NESTEROV),
        ("MAXIMIZE", sgd_flags::MAXIMIZE),
        ("FUSED", sgd_flags::FUSED),
    ],
};

/// `torch.optim.Adam`/`AdamW`'s step.
pub(crate) const ADAM: KernelSpec = KernelSpec {
    name: "adam",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE, shaders::OPTIM_MATH],
    body: shaders::ADAM,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("scalars"),
        arena_inout("params", "FORMAT"),
        arena_in("grads", "FORMAT"),
        arena_inout("exp_avg", "FORMAT"),
        arena_inout("exp_avg_sq", "FORMAT"),
        arena_inout("max_exp_avg_sq", "FORMAT"),
    ],
    overrides: &["FORMAT"],
    structs: &[Dispatch::SPEC, AdamScalars::SPEC],
    constants: &[
        ("BLOCK_ELEMENTS", BLOCK_ELEMENTS as u32),
        ("ACTIVE", adam_flags::ACTIVE),
        ("MAXIMIZE", adam_flags::MAXIMIZE),
        ("AMSGRAD", adam_flags::AMSGRAD),
        ("DECOUPLED", adam_flags::DECOUPLED),
        ("FUSED", adam_flags::FUSED),
    ],
};

/// Group averaging.
pub(crate) const AVERAGE: KernelSpec = KernelSpec {
    name: "average",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE],
    body: shaders::AVERAGE,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("averaged"),
        arena_inout("arena", "FORMAT"),
    ],
    overrides: &["FORMAT", "ARITH"],
    structs: &[Dispatch::SPEC],
    constants: TABLE_CONSTANTS,
};

/// DDP's gradient all-reduce with joined ranks.
pub(crate) const SCALED_SUM: KernelSpec = KernelSpec {
    name: "scaled_sum",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE],
    body: shaders::SCALED_SUM,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("reduced"),
        read("scales"),
        read("table"),
        arena_inout("arena", "FORMAT"),
    ],
    overrides: &["FORMAT", "ARITH"],
    structs: &[Dispatch::SPEC],
    constants: &[
        ("BLOCK_ELEMENTS", BLOCK_ELEMENTS as u32),
        ("CONTRIBUTES", scaled_sum_flags::CONTRIBUTES),
        ("RECEIVES", scaled_sum_flags::RECEIVES),
    ],
};

/// The shader-copy roofline (benchmarks only).
pub(crate) const COPY: KernelSpec = KernelSpec {
    name: "copy",
    prelude: &[shaders::PACKING],
    body: shaders::COPY,
    bindings: &[uniform("copy"), read("src"), read_write("dst")],
    overrides: &[],
    structs: &[CopyUniforms::SPEC],
    constants: FORMAT_CONSTANTS,
};

/// DiLoCo's pseudo-gradient.
pub(crate) const PSEUDO_GRADIENT: KernelSpec = KernelSpec {
    name: "pseudo_gradient",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE],
    body: shaders::PSEUDO_GRADIENT,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("synced"),
        read("backup"),
        read_write("params"),
        read_write("grads"),
    ],
    overrides: &["FORMAT"],
    structs: &[Dispatch::SPEC],
    constants: TABLE_CONSTANTS,
};

/// Storage-format conversion.
pub(crate) const CONVERT: KernelSpec = KernelSpec {
    name: "convert",
    prelude: &[shaders::PACKING, shaders::PARAM_TABLE],
    body: shaders::CONVERT,
    bindings: &[
        uniform("geometry"),
        read("starts"),
        read("converted"),
        read("src"),
        read_write("dst"),
    ],
    overrides: &["SRC_FORMAT", "DST_FORMAT"],
    structs: &[Dispatch::SPEC],
    constants: TABLE_CONSTANTS,
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
    &PSEUDO_GRADIENT,
    &CONVERT,
];

#[cfg(test)]
mod tests {
    //! Reflection of every kernel's WGSL (naga, the front end wgpu itself uses) against its
    //! spec: the test that fails when one side of the contract changes alone.

    use naga::{AddressSpace, Module, StorageAccess, TypeInner};

    use super::*;

    fn parse(spec: &KernelSpec) -> Module {
        naga::front::wgsl::parse_str(&spec.source())
            .unwrap_or_else(|e| panic!("{}: {}", spec.name, e.emit_to_string(&spec.source())))
    }

    /// Every mismatch between `spec` and its shader, as readable lines (empty: they agree).
    pub(super) fn mismatches(spec: &KernelSpec, module: &Module) -> Vec<String> {
        let mut out = Vec::new();
        let name = spec.name;
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");

        // Bindings: group 0, numbered in order, with the spec's name and access.
        let mut bindings: Vec<(u32, u32, String, AddressSpace, naga::Handle<naga::Type>)> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                g.binding.as_ref().map(|b| {
                    (
                        b.group,
                        b.binding,
                        g.name.clone().unwrap_or_default(),
                        g.space,
                        g.ty,
                    )
                })
            })
            .collect();
        bindings.sort_by_key(|b| (b.0, b.1));
        if bindings.len() != spec.bindings.len() {
            out.push(format!(
                "{name}: the shader has {} bindings, the host declares {}",
                bindings.len(),
                spec.bindings.len()
            ));
        }
        for (i, (want, got)) in spec.bindings.iter().zip(&bindings).enumerate() {
            let (group, binding, var, space, _) = got;
            if (*group, *binding) != (0, i as u32) {
                out.push(format!(
                    "{name}: binding {i} (`{}`) is @group({group}) @binding({binding}) in the shader",
                    want.name
                ));
            }
            if var != want.name {
                out.push(format!(
                    "{name}: binding {i} is `{var}` in the shader, `{}` on the host",
                    want.name
                ));
            }
            let kind = match space {
                AddressSpace::Uniform => Some(Binding::Uniform),
                AddressSpace::Storage { access } if *access == StorageAccess::LOAD => {
                    Some(Binding::Read)
                }
                AddressSpace::Storage { access }
                    if *access == StorageAccess::LOAD | StorageAccess::STORE =>
                {
                    Some(Binding::ReadWrite)
                }
                _ => None,
            };
            if kind != Some(want.kind) {
                out.push(format!(
                    "{name}: binding {i} (`{var}`) is {space:?} in the shader, {:?} on the host",
                    want.kind
                ));
            }
        }

        // Overrides: the names the host sets, nothing more.
        let mut overrides: Vec<&str> = module
            .overrides
            .iter()
            .filter_map(|(_, o)| o.name.as_deref())
            .collect();
        overrides.sort_unstable();
        let mut declared: Vec<&str> = spec.overrides.to_vec();
        declared.sort_unstable();
        if overrides != declared {
            out.push(format!(
                "{name}: overrides {overrides:?} in the shader, {declared:?} on the host"
            ));
        }

        // Structs: each host twin's named fields at the shader's offsets, and the same size.
        for s in spec.structs {
            let found = module
                .types
                .iter()
                .find(|(_, t)| t.name.as_deref() == Some(s.wgsl_name));
            let Some((handle, ty)) = found else {
                out.push(format!("{name}: no struct {} in the shader", s.wgsl_name));
                continue;
            };
            let size = layouter[handle].size as usize;
            if size != s.size {
                out.push(format!(
                    "{name}: struct {} is {size} bytes in the shader, {} on the host",
                    s.wgsl_name, s.size
                ));
            }
            let TypeInner::Struct { members, .. } = &ty.inner else {
                out.push(format!("{name}: {} is not a struct", s.wgsl_name));
                continue;
            };
            let shader_fields: Vec<(&str, usize)> = members
                .iter()
                .filter_map(|m| m.name.as_deref().map(|n| (n, m.offset as usize)))
                .filter(|(n, _)| !n.starts_with('_'))
                .collect();
            if shader_fields != s.fields {
                out.push(format!(
                    "{name}: struct {} has fields {shader_fields:?} in the shader, {:?} on the host",
                    s.wgsl_name, s.fields
                ));
            }
        }

        // Constants the host relies on.
        for &(constant, value) in spec.constants {
            let found = module
                .constants
                .iter()
                .find(|(_, c)| c.name.as_deref() == Some(constant))
                .map(|(_, c)| &module.global_expressions[c.init]);
            match found {
                Some(naga::Expression::Literal(naga::Literal::U32(v))) if *v == value => {}
                Some(other) => out.push(format!(
                    "{name}: const {constant} is {other:?} in the shader, {value} on the host"
                )),
                None => out.push(format!("{name}: no const {constant} in the shader")),
            }
        }
        out
    }

    #[test]
    fn every_kernel_matches_its_spec() {
        let problems: Vec<String> = ALL
            .iter()
            .flat_map(|spec| mismatches(spec, &parse(spec)))
            .collect();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn a_change_on_one_side_only_is_caught() {
        // The check itself must fail on each kind of drift: a binding's access, its name, a
        // struct field, an override, a constant. Each is made on the host side here (the
        // shader side is the same comparison read the other way).
        let mut bindings = SGD.bindings.to_vec();
        bindings[4] = arena_inout("grads", "FORMAT");
        let wrong_access = KernelSpec {
            bindings: Vec::leak(bindings),
            ..SGD
        };
        let module = parse(&SGD);
        assert!(
            mismatches(&wrong_access, &module)
                .iter()
                .any(|m| m.contains("binding 4"))
        );

        let renamed = KernelSpec {
            bindings: Vec::leak(vec![
                uniform("geometry"),
                read("starts"),
                read("averaged"),
                arena_inout("values", "FORMAT"),
            ]),
            ..AVERAGE
        };
        let module = parse(&AVERAGE);
        assert!(
            mismatches(&renamed, &module)
                .iter()
                .any(|m| m.contains("`arena` in the shader"))
        );

        let mut fields = SgdScalars::SPEC.fields.to_vec();
        fields.swap(1, 2);
        let swapped = KernelSpec {
            structs: Vec::leak(vec![StructSpec {
                fields: Vec::leak(fields),
                ..SgdScalars::SPEC
            }]),
            ..SGD
        };
        assert!(
            mismatches(&swapped, &parse(&SGD))
                .iter()
                .any(|m| m.contains("struct SgdScalars"))
        );

        let overrides = KernelSpec {
            overrides: &["FORMAT"],
            ..AVERAGE
        };
        assert!(
            mismatches(&overrides, &parse(&AVERAGE))
                .iter()
                .any(|m| m.contains("overrides"))
        );

        let flags = KernelSpec {
            constants: &[("NESTEROV", 16)],
            ..SGD
        };
        assert!(
            mismatches(&flags, &parse(&SGD))
                .iter()
                .any(|m| m.contains("const NESTEROV"))
        );
    }
}
