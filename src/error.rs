//! One error type whose kinds mirror Python's exception classes, so that PyTorch's
//! messages (and the golden cases' `error.type`) map one to one.

use std::fmt;

/// The Python exception class an [`Error`] corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Python's `ValueError`: an argument has the right type but a wrong value or shape.
    ValueError,
    /// Python's `TypeError`: an argument has the wrong type.
    TypeError,
    /// Python's `RuntimeError`: the operation cannot run in the current state.
    RuntimeError,
    /// Python's `IndexError`.
    IndexError,
    /// Python's `ZeroDivisionError`.
    ZeroDivisionError,
}

impl ErrorKind {
    /// The Python class name, e.g. `"ValueError"`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ValueError => "ValueError",
            ErrorKind::TypeError => "TypeError",
            ErrorKind::RuntimeError => "RuntimeError",
            ErrorKind::IndexError => "IndexError",
            ErrorKind::ZeroDivisionError => "ZeroDivisionError",
        }
    }

    /// Parses a Python class name; `None` for names distopt never raises.
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        Some(match name {
            "ValueError" => ErrorKind::ValueError,
            "TypeError" => ErrorKind::TypeError,
            "RuntimeError" => ErrorKind::RuntimeError,
            "IndexError" => ErrorKind::IndexError,
            "ZeroDivisionError" => ErrorKind::ZeroDivisionError,
            _ => return None,
        })
    }
}

/// Every failure distopt reports: a Python-like kind plus a message that names what is wrong
/// (which rank, which parameter, which shape or dtype).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// A `ValueError`.
    pub fn value(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ValueError, message)
    }

    /// A `TypeError`.
    pub fn type_error(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::TypeError, message)
    }

    /// A `RuntimeError`.
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::RuntimeError, message)
    }

    /// The Python class this error mirrors.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message alone, as Python's `str(exception)` prints it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl std::error::Error for Error {}

/// `Result` with distopt's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
