//! The bindings a kernel's WGSL declares, read from its text, so that the host builds the bind
//! group layout from the shader and binds each buffer by the name the shader gives it, never by
//! position. A declaration is one line:
//!
//! ```text
//! @group(0) @binding(4) var<storage, read> grads: array<vec4<u32>>; // #arena FORMAT
//! ```
//!
//! The trailing `// #arena FORMAT` marks a packed arena (`array<vec4<u32>>` in the storage
//! format that the override or constant `FORMAT` holds): the assembler generates its
//! `load_<name>`, and for a `read_write` one its `store_<name>`.
//!
//! Plain string processing, at backend start-up (natively and in the browser, where naga is
//! not linked); the tests check the table against naga's reflection of every assembled module.

use super::shader_error::ShaderError;

/// How a binding is used by the shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>` (or `var<storage>`).
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
}

/// One binding of bind group 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Binding {
    pub(crate) number: u32,
    pub(crate) name: String,
    pub(crate) access: Access,
    /// With `// #arena FORMAT`: the name holding the arena's storage format.
    pub(crate) arena: Option<String>,
}

/// A module's bindings, by binding number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bindings {
    kernel: String,
    bindings: Vec<Binding>,
}

impl Bindings {
    /// The bindings `source` (the module of `kernel`) declares.
    pub(crate) fn parse(kernel: &str, source: &str) -> Result<Bindings, ShaderError> {
        let mut bindings: Vec<Binding> = Vec::new();
        for (i, line) in source.lines().enumerate() {
            let line = line.trim();
            if !line.starts_with('@') || !line.contains("@binding(") {
                continue;
            }
            let error = |why: &str| ShaderError::Binding {
                kernel: kernel.into(),
                line: i + 1,
                why: format!("{why}: `{line}`"),
            };
            let binding = declaration(line).ok_or_else(|| {
                error("not `@group(0) @binding(N) var<…> name: type; [// #arena FORMAT]`")
            })?;
            if binding.arena.is_some() && !line.contains(": array<vec4<u32>>;") {
                return Err(error("an arena is an array<vec4<u32>>"));
            }
            if bindings
                .iter()
                .any(|b| b.number == binding.number || b.name == binding.name)
            {
                return Err(error("declared twice"));
            }
            bindings.push(binding);
        }
        bindings.sort_by_key(|b| b.number);
        Ok(Bindings {
            kernel: kernel.into(),
            bindings,
        })
    }

    /// The bindings, by number.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Binding> {
        self.bindings.iter()
    }

    /// Each of `named`'s values with the number of the binding its name declares: every
    /// binding once, no other name.
    pub(crate) fn resolve<T: Copy>(
        &self,
        named: &[(&str, T)],
    ) -> Result<Vec<(u32, T)>, ShaderError> {
        let kernel = || self.kernel.clone();
        let mut out = Vec::with_capacity(named.len());
        for (k, &(name, value)) in named.iter().enumerate() {
            let Some(b) = self.bindings.iter().find(|b| b.name == name) else {
                return Err(ShaderError::UnknownBinding {
                    kernel: kernel(),
                    name: name.into(),
                });
            };
            if named[..k].iter().any(|(n, _)| *n == name) {
                return Err(ShaderError::BoundTwice {
                    kernel: kernel(),
                    name: name.into(),
                });
            }
            out.push((b.number, value));
        }
        if let Some(b) = self
            .bindings
            .iter()
            .find(|b| !named.iter().any(|(n, _)| *n == b.name))
        {
            return Err(ShaderError::Unbound {
                kernel: kernel(),
                name: b.name.clone(),
            });
        }
        Ok(out)
    }
}

/// One declaration line, or `None` when it is not of the one form read.
fn declaration(line: &str) -> Option<Binding> {
    let rest = line.strip_prefix("@group(0)")?.trim_start();
    let rest = rest.strip_prefix("@binding(")?;
    let (number, rest) = rest.split_once(')')?;
    let number = number.trim().parse().ok()?;
    let rest = rest.trim_start().strip_prefix("var<")?;
    let (space, rest) = rest.split_once('>')?;
    let space: Vec<&str> = space.split(',').map(str::trim).collect();
    let access = match space.as_slice() {
        ["uniform"] => Access::Uniform,
        ["storage"] | ["storage", "read"] => Access::Read,
        ["storage", "read_write"] => Access::ReadWrite,
        _ => return None,
    };
    let (name, rest) = rest.split_once(':')?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return None;
    }
    let (_, note) = rest.split_once(';')?;
    let note = note.trim();
    let arena = match note.strip_prefix("// #arena ").map(str::trim) {
        Some(format) if !format.is_empty() && !format.contains(' ') => Some(format.to_string()),
        Some(_) => return None,
        None if note.is_empty() || (note.starts_with("//") && !note.starts_with("// #")) => None,
        None => return None,
    };
    Some(Binding {
        number,
        name: name.into(),
        access,
        arena,
    })
}

#[cfg(test)]
mod tests {
    //! The table the host binds by against naga's reflection of every assembled module, and
    //! binding by name against a shader whose bindings were renumbered.

    use naga::{AddressSpace, StorageAccess};

    use super::*;
    use crate::backend::gpu::assemble::assemble;
    use crate::backend::gpu::contract::{ADAM, ALL, LIBRARIES, WgslFile};

    /// (group, binding, name, access) of every bound global, by naga.
    fn reflect(source: &str) -> Vec<(u32, u32, String, Option<Access>)> {
        let module = naga::front::wgsl::parse_str(source).expect("parses");
        let mut out: Vec<_> = module
            .global_variables
            .iter()
            .filter_map(|(_, g)| {
                let b = g.binding.as_ref()?;
                let access = match g.space {
                    AddressSpace::Uniform => Some(Access::Uniform),
                    AddressSpace::Storage { access } if access == StorageAccess::LOAD => {
                        Some(Access::Read)
                    }
                    AddressSpace::Storage { access }
                        if access == StorageAccess::LOAD | StorageAccess::STORE =>
                    {
                        Some(Access::ReadWrite)
                    }
                    _ => None,
                };
                Some((b.group, b.binding, g.name.clone()?, access))
            })
            .collect();
        out.sort_by_key(|b| (b.0, b.1));
        out
    }

    fn table(bindings: &Bindings) -> Vec<(u32, u32, String, Option<Access>)> {
        bindings
            .iter()
            .map(|b| (0, b.number, b.name.clone(), Some(b.access)))
            .collect()
    }

    #[test]
    fn every_kernel_binds_what_naga_reads() {
        for kernel in ALL {
            let assembled = assemble(kernel, LIBRARIES).expect(kernel.name);
            assert_eq!(
                table(&assembled.bindings),
                reflect(&assembled.source),
                "{}",
                kernel.name
            );
            let overrides = naga::front::wgsl::parse_str(&assembled.source)
                .expect("parses")
                .overrides
                .iter()
                .filter_map(|(_, o)| o.name.clone())
                .collect::<Vec<_>>();
            assert_eq!(assembled.overrides, overrides, "{}", kernel.name);
        }
    }

    /// The case positional binding missed: two bindings of one type exchange numbers in the
    /// shader (and, to keep a positional contract test green, in its binding list). Bound by
    /// name, each buffer still reaches the variable of its name.
    #[test]
    fn swapped_bindings_are_bound_by_name() {
        let swapped = ADAM
            .wgsl
            .replace(
                "@binding(5) var<storage, read_write> exp_avg:",
                "@binding(@6@)",
            )
            .replace(
                "@binding(6) var<storage, read_write> exp_avg_sq:",
                "@binding(5) var<storage, read_write> exp_avg_sq:",
            )
            .replace(
                "@binding(@6@)",
                "@binding(6) var<storage, read_write> exp_avg:",
            );
        assert_ne!(swapped, ADAM.wgsl, "the swap applies");
        let file = WgslFile {
            wgsl: Box::leak(swapped.into_boxed_str()),
            ..ADAM
        };
        let (original, swapped) = (
            assemble(&ADAM, LIBRARIES).expect("adam"),
            assemble(&file, LIBRARIES).expect("swapped adam"),
        );
        assert_eq!(table(&swapped.bindings), reflect(&swapped.source));
        // The host's named buffers (labels here), as `gpu/adam.rs` passes them.
        let named = [
            ("geometry", "geometry"),
            ("starts", "starts"),
            ("scalars", "scalars"),
            ("params", "params"),
            ("grads", "grads"),
            ("exp_avg", "exp_avg"),
            ("exp_avg_sq", "exp_avg_sq"),
            ("max_exp_avg_sq", "max_exp_avg_sq"),
        ];
        for assembled in [&original, &swapped] {
            let shader = reflect(&assembled.source);
            for (number, buffer) in assembled.bindings.resolve(&named).expect("resolves") {
                let var = &shader.iter().find(|b| b.1 == number).expect("bound").2;
                assert_eq!(var, buffer, "buffer `{buffer}` bound to `{var}`");
            }
        }
        let at = |a: &Assembled, name: &str| {
            a.bindings.iter().find(|b| b.name == name).map(|b| b.number)
        };
        assert_eq!(
            (at(&original, "exp_avg"), at(&swapped, "exp_avg")),
            (Some(5), Some(6))
        );
    }

    use crate::backend::gpu::assemble::Assembled;

    #[test]
    fn a_wrong_name_is_an_error() {
        let b = assemble(&ADAM, LIBRARIES).expect("adam").bindings;
        let all: Vec<(&str, ())> = b.iter().map(|b| (b.name.as_str(), ())).collect();
        assert!(b.resolve(&all).is_ok());
        let mut typo = all.clone();
        typo[5].0 = "exp_avgs";
        assert!(
            matches!(b.resolve(&typo), Err(ShaderError::UnknownBinding { name, .. }) if name == "exp_avgs")
        );
        let mut twice = all.clone();
        twice.push(("grads", ()));
        assert!(
            matches!(b.resolve(&twice), Err(ShaderError::BoundTwice { name, .. }) if name == "grads")
        );
        let short = &all[..7];
        assert!(
            matches!(b.resolve(short), Err(ShaderError::Unbound { name, .. }) if name == "max_exp_avg_sq")
        );
    }

    #[test]
    fn a_malformed_declaration_is_an_error() {
        for line in [
            "@group(1) @binding(0) var<uniform> u: U;",
            "@group(0) @binding(0) var<workgroup> u: U;",
            "@group(0) @binding(0) var<storage, read> a: array<u32>; // #arena FORMAT",
            "@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>; // #arenas FORMAT",
        ] {
            assert!(
                matches!(
                    Bindings::parse("k", line),
                    Err(ShaderError::Binding { line: 1, .. })
                ),
                "{line}"
            );
        }
        let twice =
            "@group(0) @binding(0) var<uniform> u: U;\n@group(0) @binding(0) var<uniform> v: U;";
        assert!(Bindings::parse("k", twice).is_err());
        let ok = Bindings::parse(
            "k",
            "@group(0) @binding(1) var<storage, read_write> a: array<vec4<u32>>; // #arena F\n@group(0) @binding(0) var<uniform> u: U; // the uniforms",
        )
        .expect("parses");
        let a = ok.iter().nth(1).expect("two");
        assert_eq!(
            (a.number, a.access, a.arena.as_deref()),
            (1, Access::ReadWrite, Some("F"))
        );
    }
}
