//! One error type whose kinds mirror Python's exception classes, so that PyTorch's
//! messages (and the golden cases' `error.type`) map one to one.

use std::fmt;

/// The Python exception class an [`Error`] corresponds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// Python's `AssertionError`: a consistency check PyTorch asserts, mirrored where PyTorch
    /// users meet it (ZeRO's `state_dict` after a group was added).
    AssertionError,
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
            ErrorKind::AssertionError => "AssertionError",
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
            "AssertionError" => ErrorKind::AssertionError,
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

/// The errors of a call that every local rank makes (a constructor, a collective), each
/// rank's own: PyTorch raises on every rank separately, and a message may name the rank. A
/// rank that is not listed succeeded. Converts to the lowest rank's [`Error`] for callers that
/// want one error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankErrors {
    /// (world rank, its error), by rank; never empty.
    errors: Vec<(usize, Error)>,
}

impl RankErrors {
    /// The errors of the listed ranks (a rank listed twice keeps its first); `None` when
    /// the list is empty (nobody raised).
    pub fn new(errors: impl IntoIterator<Item = (usize, Error)>) -> Option<RankErrors> {
        let mut errors: Vec<(usize, Error)> = errors.into_iter().collect();
        errors.sort_by_key(|(rank, _)| *rank);
        errors.dedup_by_key(|(rank, _)| *rank);
        (!errors.is_empty()).then_some(RankErrors { errors })
    }

    /// Every rank of `ranks` raised: rank `r` the error `error(r)`. An empty range stands for
    /// the calling process: rank 0.
    pub fn on_ranks(ranks: std::ops::Range<usize>, error: impl Fn(usize) -> Error) -> RankErrors {
        let ranks = if ranks.is_empty() { 0..1 } else { ranks };
        RankErrors {
            errors: ranks.map(|r| (r, error(r))).collect(),
        }
    }

    /// Splits per-rank outcomes (`(rank, result)`) into the values and, if any rank raised,
    /// the errors.
    ///
    /// # Errors
    /// The [`RankErrors`] of every rank whose outcome is an error, when there is one.
    pub fn collect<T>(
        outcomes: impl IntoIterator<Item = (usize, Result<T>)>,
    ) -> std::result::Result<Vec<T>, RankErrors> {
        let mut values = Vec::new();
        let mut errors = Vec::new();
        for (rank, outcome) in outcomes {
            match outcome {
                Ok(v) => values.push(v),
                Err(e) => errors.push((rank, e)),
            }
        }
        match RankErrors::new(errors) {
            Some(errors) => Err(errors),
            None => Ok(values),
        }
    }

    /// Every rank of `ranks` raised the same `error` (a check every rank makes alike).
    pub fn all(ranks: std::ops::Range<usize>, error: Error) -> RankErrors {
        RankErrors::on_ranks(ranks, |_| error.clone())
    }

    /// The ranks that raised, ascending.
    pub fn ranks(&self) -> Vec<usize> {
        self.errors.iter().map(|(r, _)| *r).collect()
    }

    /// Rank `rank`'s error, if it raised.
    pub fn get(&self, rank: usize) -> Option<&Error> {
        self.errors.iter().find(|(r, _)| *r == rank).map(|(_, e)| e)
    }

    /// (rank, error) pairs, by rank.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Error)> {
        self.errors.iter().map(|(r, e)| (*r, e))
    }

    /// The lowest raising rank's error.
    pub fn first(&self) -> &Error {
        &self.errors[0].1
    }
}

impl From<RankErrors> for Error {
    fn from(errors: RankErrors) -> Error {
        let mut errors = errors.errors;
        errors.swap_remove(0).1
    }
}

impl fmt::Display for RankErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, (rank, error)) in self.errors.iter().enumerate() {
            if k > 0 {
                f.write_str("; ")?;
            }
            write!(f, "rank {rank}: {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RankErrors {}
