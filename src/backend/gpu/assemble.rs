//! A kernel's complete WGSL module, assembled from its file: first, depth first, the libraries
//! it imports, each once and after its own imports; each file preceded by the declarations the
//! Rust side generates for it (`contract::Declarations`); then the kernel; then the
//! `load_<name>`/`store_<name>` helpers of its packed-arena bindings.
//!
//! A file names what it uses in its header (the comment lines before its first line of code),
//! one directive a line:
//!
//! ```text
//! // #import packing
//! // #import param_table
//! ```
//!
//! An unknown name, a name imported twice by one file, an import cycle, an unknown directive or
//! a directive below the header is a [`ShaderError`]. Plain string processing: it runs when a
//! backend opens, natively and in the browser.

use super::bindings::{Access, Bindings};
use super::contract::WgslFile;
pub(crate) use super::shader_error::ShaderError;

/// An assembled kernel module.
#[derive(Debug)]
pub(crate) struct Assembled {
    /// The complete WGSL.
    pub(crate) source: String,
    /// Its bindings, as declared.
    pub(crate) bindings: Bindings,
    /// Its `override` constants, in declaration order.
    pub(crate) overrides: Vec<String>,
}

/// `kernel`'s module, its imports resolved against `libraries`.
pub(crate) fn assemble(
    kernel: &WgslFile,
    libraries: &[&WgslFile],
) -> Result<Assembled, ShaderError> {
    let mut source = String::new();
    let mut done = Vec::new();
    include(
        kernel,
        libraries,
        &mut vec![kernel.name],
        &mut done,
        &mut source,
    )?;
    let bindings = Bindings::parse(kernel.name, &source)?;
    for b in bindings.iter() {
        if let Some(format) = &b.arena {
            source.push_str(&accessors(&b.name, format, b.access == Access::ReadWrite));
        }
    }
    let overrides = source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("override "))
        .map(|rest| {
            rest.split(|c: char| c == ':' || c == '=' || c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    Ok(Assembled {
        source,
        bindings,
        overrides,
    })
}

/// Appends `file` to `out` after its imports not yet in `done`; `path` is the chain of files
/// being included.
fn include<'a>(
    file: &'a WgslFile,
    libraries: &[&'a WgslFile],
    path: &mut Vec<&'a str>,
    done: &mut Vec<&'a str>,
    out: &mut String,
) -> Result<(), ShaderError> {
    for import in imports(file)? {
        if done.contains(&import) {
            continue;
        }
        let error = |kind: fn(String, String) -> ShaderError| kind(file.name.into(), import.into());
        if path.contains(&import) {
            return Err(error(|file, import| ShaderError::ImportCycle {
                file,
                import,
            }));
        }
        let Some(library) = libraries.iter().find(|l| l.name == import) else {
            return Err(error(|file, import| ShaderError::UnknownImport {
                file,
                import,
            }));
        };
        path.push(library.name);
        include(library, libraries, path, done, out)?;
        path.pop();
    }
    out.push_str(&file.declares.wgsl(file.name));
    out.push_str(file.wgsl);
    out.push('\n');
    done.push(file.name);
    Ok(())
}

/// The names `file` imports, in order.
pub(crate) fn imports(file: &WgslFile) -> Result<Vec<&str>, ShaderError> {
    let mut names: Vec<&str> = Vec::new();
    let mut header = true;
    for (i, line) in file.wgsl.lines().enumerate() {
        let line = line.trim();
        let at = || (file.name.to_string(), i + 1);
        if let Some(directive) = line.strip_prefix("// #") {
            if !header {
                let (file, line) = at();
                return Err(ShaderError::MisplacedDirective { file, line });
            }
            let import = directive.strip_prefix("import ").map(str::trim);
            let Some(import) = import.filter(|n| is_identifier(n)) else {
                let (file, line) = at();
                return Err(ShaderError::UnknownDirective { file, line });
            };
            if names.contains(&import) {
                return Err(ShaderError::DuplicateImport {
                    file: file.name.into(),
                    import: import.into(),
                });
            }
            names.push(import);
        } else if !line.is_empty() && !line.starts_with("//") {
            header = false;
        }
    }
    Ok(names)
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `load_<name>`/`store_<name>` for an arena binding: eight elements at `octet` of the rank
/// whose first `vec4<u32>` word is `base`, as two words (float32) or one packed word quad, in
/// the storage format `format` (an override or constant) holds.
fn accessors(name: &str, format: &str, store: bool) -> String {
    let mut text = format!(
        "\nfn load_{name}(base: u32, octet: u32) -> Eight {{\n    \
         if ({format} == FORMAT_F32) {{\n        \
         return Eight(bitcast<vec4<f32>>({name}[base + 2u * octet]), bitcast<vec4<f32>>({name}[base + 2u * octet + 1u]));\n    \
         }}\n    \
         return unpack_eight({format}, {name}[base + octet]);\n}}\n"
    );
    if store {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::gpu::contract::{ALL, Declarations, LIBRARIES, SGD};

    const fn file(name: &'static str, wgsl: &'static str) -> WgslFile {
        WgslFile {
            name,
            wgsl,
            declares: Declarations::NONE,
        }
    }

    #[test]
    fn every_kernel_assembles_with_its_imports_once_and_in_order() {
        for kernel in ALL {
            let assembled = assemble(kernel, LIBRARIES).expect(kernel.name);
            let source = &assembled.source;
            // packing first (every file builds on it), each library once.
            let packing = source.find("fn f16_bits_to_f32").expect("packing");
            for library in LIBRARIES {
                assert!(source.matches(library.wgsl).count() <= 1, "{}", kernel.name);
            }
            assert!(packing < source.find(kernel.wgsl).expect("the kernel"));
        }
        let sgd = assemble(&SGD, LIBRARIES).expect("sgd").source;
        assert!(sgd.contains("fn exact_fma1") && sgd.contains("fn find_param"));
        assert_eq!(
            imports(&SGD),
            Ok(vec!["packing", "param_table", "optim_math"])
        );
    }

    #[test]
    fn a_wrong_import_is_a_typed_error() {
        let a = file("a", "// #import b\nfn a() {}\n");
        let b = file("b", "// #import a\nfn b() {}\n");
        let unknown = file("k", "// About k.\n// #import nowhere\nfn main() {}\n");
        assert_eq!(
            assemble(&unknown, &[]).map(|a| a.source),
            Err(ShaderError::UnknownImport {
                file: "k".into(),
                import: "nowhere".into()
            })
        );
        let twice = file("k", "// #import a\n// #import a\nfn main() {}\n");
        assert_eq!(
            assemble(&twice, &[&a, &b]).map(|a| a.source),
            Err(ShaderError::DuplicateImport {
                file: "k".into(),
                import: "a".into()
            })
        );
        let cycle = file("k", "// #import a\nfn main() {}\n");
        assert_eq!(
            assemble(&cycle, &[&a, &b]).map(|a| a.source),
            Err(ShaderError::ImportCycle {
                file: "b".into(),
                import: "a".into()
            })
        );
        let late = file("k", "// k\nfn main() {}\n// #import a\n");
        assert_eq!(
            assemble(&late, &[&a]).map(|a| a.source),
            Err(ShaderError::MisplacedDirective {
                file: "k".into(),
                line: 3
            })
        );
        let typo = file("k", "// #include a\nfn main() {}\n");
        assert_eq!(
            assemble(&typo, &[&a]).map(|a| a.source),
            Err(ShaderError::UnknownDirective {
                file: "k".into(),
                line: 1
            })
        );
        // A library imported by two files is included once (no error).
        let shared = file("k", "// #import a\n// #import c\nfn main() {}\n");
        let c = file("c", "// #import d\nfn c() {}\n");
        let d = file("d", "fn d() {}\n");
        let a = file("a", "// #import d\nfn a() {}\n");
        let source = assemble(&shared, &[&a, &c, &d]).expect("assembles").source;
        assert_eq!(source.matches("fn d()").count(), 1);
        assert!(source.find("fn d()") < source.find("fn a()"));
        assert!(
            crate::error::Error::from(ShaderError::UnknownImport {
                file: "k".into(),
                import: "x".into()
            })
            .to_string()
            .contains("no such WGSL library")
        );
    }
}
