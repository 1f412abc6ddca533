//! [`ShaderError`]: why a kernel's WGSL could not be assembled or bound.

use std::fmt;

/// Why a kernel's WGSL could not be assembled or bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ShaderError {
    /// `// #import` of a name that is no library.
    UnknownImport { file: String, import: String },
    /// One file imports a name twice.
    DuplicateImport { file: String, import: String },
    /// A library imports, directly or not, itself.
    ImportCycle { file: String, import: String },
    /// A `// #` directive this assembler does not know.
    UnknownDirective { file: String, line: usize },
    /// A directive below the file's header.
    MisplacedDirective { file: String, line: usize },
    /// A binding declaration that cannot be read.
    Binding {
        kernel: String,
        line: usize,
        why: String,
    },
    /// The host binds a name the shader does not declare.
    UnknownBinding { kernel: String, name: String },
    /// The host binds a name twice.
    BoundTwice { kernel: String, name: String },
    /// The host leaves a binding of the shader unbound.
    Unbound { kernel: String, name: String },
    /// The host's override values do not name the shader's overrides, each once.
    Overrides {
        kernel: String,
        given: Vec<String>,
        declared: Vec<String>,
    },
}

impl fmt::Display for ShaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownImport { file, import } => {
                write!(f, "{file}: `// #import {import}`: no such WGSL library")
            }
            Self::DuplicateImport { file, import } => {
                write!(f, "{file}: `{import}` is imported twice")
            }
            Self::ImportCycle { file, import } => {
                write!(f, "{file}: importing `{import}` makes a cycle")
            }
            Self::UnknownDirective { file, line } => {
                write!(
                    f,
                    "{file}, line {line}: unknown directive (`// #import <name>` expected)"
                )
            }
            Self::MisplacedDirective { file, line } => write!(
                f,
                "{file}, line {line}: a directive below the file's header (its leading comments)"
            ),
            Self::Binding { kernel, line, why } => {
                write!(f, "{kernel}, line {line} of the module: binding: {why}")
            }
            Self::UnknownBinding { kernel, name } => {
                write!(f, "{kernel}: the shader has no binding `{name}`")
            }
            Self::BoundTwice { kernel, name } => write!(f, "{kernel}: `{name}` is bound twice"),
            Self::Unbound { kernel, name } => write!(f, "{kernel}: binding `{name}` is not bound"),
            Self::Overrides {
                kernel,
                given,
                declared,
            } => write!(
                f,
                "{kernel}: overrides {given:?} given, the shader declares {declared:?}"
            ),
        }
    }
}

impl std::error::Error for ShaderError {}

impl From<ShaderError> for crate::error::Error {
    fn from(error: ShaderError) -> Self {
        crate::error::Error::runtime(format!("WGSL: {error}"))
    }
}
