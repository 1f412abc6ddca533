//! Warnings PyTorch would emit (`warnings.warn` and `logger.warning`), made observable: each is
//! logged through the `log` crate and recorded on the calling thread, where a caller or a test
//! reads them with [`take`] (the texts) or [`take_records`] (with channel, category and the
//! ranks that emitted them).
//!
//! In PyTorch every rank is a process that warns on its own; here one process may hold several
//! ranks (the simulated world), so a record says which ranks emitted it. Code that runs on
//! behalf of a set of ranks (a ZeRO step, a join context) opens a [`with_ranks`] scope: a
//! warning emitted inside without ranks of its own is attributed to the scope's ranks.

use std::cell::RefCell;
use std::fmt;
use std::ops::Range;

/// How PyTorch reports a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Python's `warnings.warn`, with a warning class as its category (`UserWarning`, …).
    Warnings,
    /// A `logging` record (`logger.warning`), with the level name as its category (`WARNING`).
    Logging,
}

impl Channel {
    /// `"warnings"` or `"logging"`, as the golden cases name the channels.
    pub fn name(self) -> &'static str {
        match self {
            Channel::Warnings => "warnings",
            Channel::Logging => "logging",
        }
    }
}

/// One emitted warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// PyTorch's text.
    pub message: String,
    /// `warnings.warn` or a logging record.
    pub channel: Channel,
    /// The warning class (`UserWarning`, `DeprecationWarning`) or the logging level (`WARNING`).
    pub category: String,
    /// The world ranks that emitted it, ascending; `None` when it is not tied to ranks (the
    /// process itself warned).
    pub ranks: Option<Vec<usize>>,
}

impl Warning {
    /// A `warnings.warn(message)`: a `UserWarning`.
    pub fn user(message: impl Into<String>) -> Warning {
        Warning {
            message: message.into(),
            channel: Channel::Warnings,
            category: "UserWarning".into(),
            ranks: None,
        }
    }

    /// A `warnings.warn(message, category)` of another class, e.g. `DeprecationWarning`.
    pub fn of_class(message: impl Into<String>, category: &str) -> Warning {
        Warning {
            category: category.into(),
            ..Warning::user(message)
        }
    }

    /// A `logger.warning(message)` record.
    pub fn logged(message: impl Into<String>) -> Warning {
        Warning {
            message: message.into(),
            channel: Channel::Logging,
            category: "WARNING".into(),
            ranks: None,
        }
    }

    /// The same warning, emitted by `ranks`.
    pub fn on_ranks(mut self, ranks: impl IntoIterator<Item = usize>) -> Warning {
        let mut ranks: Vec<usize> = ranks.into_iter().collect();
        ranks.sort_unstable();
        ranks.dedup();
        self.ranks = Some(ranks);
        self
    }

    /// Whether rank `rank` emitted it (a warning not tied to ranks is every rank's).
    pub fn emitted_by(&self, rank: usize) -> bool {
        self.ranks.as_ref().is_none_or(|r| r.contains(&rank))
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ranks {
            Some(ranks) => write!(f, "{} (ranks {ranks:?}): {}", self.category, self.message),
            None => write!(f, "{}: {}", self.category, self.message),
        }
    }
}

thread_local! {
    static RECORDED: RefCell<Vec<Warning>> = const { RefCell::new(Vec::new()) };
    static SCOPES: RefCell<Vec<Range<usize>>> = const { RefCell::new(Vec::new()) };
}

/// Emits a `UserWarning` (Python's `warnings.warn(message)`): logs it and records it.
pub fn warn(message: impl Into<String>) {
    emit(Warning::user(message));
}

/// Emits a warning: logs it and records it for [`take`] / [`take_records`]. A warning without
/// ranks emitted inside a [`with_ranks`] scope is attributed to the innermost scope's ranks.
pub fn emit(mut warning: Warning) {
    if warning.ranks.is_none() {
        if let Some(ranks) = SCOPES.with(|s| s.borrow().last().cloned()) {
            warning.ranks = Some(ranks.collect());
        }
    }
    log::warn!("{}", warning.message);
    RECORDED.with(|r| r.borrow_mut().push(warning));
}

/// Runs `f` on behalf of world ranks `ranks`: the warnings it emits without ranks of their own
/// are theirs.
pub fn with_ranks<T>(ranks: Range<usize>, f: impl FnOnce() -> T) -> T {
    SCOPES.with(|s| s.borrow_mut().push(ranks));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            SCOPES.with(|s| {
                s.borrow_mut().pop();
            });
        }
    }
    let _pop = Pop;
    f()
}

/// Removes and returns the texts of the warnings recorded on this thread, oldest first.
pub fn take() -> Vec<String> {
    take_records().into_iter().map(|w| w.message).collect()
}

/// Removes and returns the warnings recorded on this thread, oldest first.
pub fn take_records() -> Vec<Warning> {
    RECORDED.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// The texts of the warnings recorded on this thread so far, without removing them.
pub fn recorded() -> Vec<String> {
    recorded_records().into_iter().map(|w| w.message).collect()
}

/// The warnings recorded on this thread so far, without removing them.
pub fn recorded_records() -> Vec<Warning> {
    RECORDED.with(|r| r.borrow().clone())
}

/// Puts warnings back at the end of this thread's record without logging them again (a front
/// end that filtered what it took).
pub fn restore(warnings: impl IntoIterator<Item = Warning>) {
    RECORDED.with(|r| r.borrow_mut().extend(warnings));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_channel_category_and_ranks() {
        take();
        warn("plain");
        with_ranks(2..4, || {
            emit(Warning::logged("scoped"));
            emit(Warning::user("own").on_ranks([3, 3]));
        });
        emit(Warning::of_class("old", "DeprecationWarning"));
        let records = take_records();
        assert_eq!(records.len(), 4);
        assert_eq!(records[0].ranks, None);
        assert_eq!(records[0].category, "UserWarning");
        assert!(records[0].emitted_by(7));
        assert_eq!(records[1].channel, Channel::Logging);
        assert_eq!(records[1].category, "WARNING");
        assert_eq!(records[1].ranks, Some(vec![2, 3]));
        assert!(!records[1].emitted_by(1));
        assert_eq!(records[2].ranks, Some(vec![3]));
        assert_eq!(records[3].category, "DeprecationWarning");
        assert_eq!(records[3].ranks, None, "the scope ended");
        assert!(take().is_empty());
    }
}
