//! Warnings PyTorch would emit (`warnings.warn` and `logger.warning`), made observable: each is
//! logged through the `log` crate and recorded on the calling thread, where a caller or a test
//! reads them with [`take`].

use std::cell::RefCell;

thread_local! {
    static RECORDED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Emits a warning: logs it and records it for [`take`].
pub fn warn(message: impl Into<String>) {
    let message = message.into();
    log::warn!("{message}");
    RECORDED.with(|r| r.borrow_mut().push(message));
}

/// Removes and returns the warnings recorded on this thread, oldest first.
pub fn take() -> Vec<String> {
    RECORDED.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// The warnings recorded on this thread so far, without removing them.
pub fn recorded() -> Vec<String> {
    RECORDED.with(|r| r.borrow().clone())
}
