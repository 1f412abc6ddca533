//! The JS boundary every binding crosses: library results become thrown JS `Error`s named
//! after their Python class (and a CPU worker's panic during the call a `RuntimeError`),
//! futures become promises whose work starts at the call, and an object a pending call still
//! holds is "busy".

use js_sys::{Array, Object};
use wasm_bindgen::prelude::*;

use super::convert;
use distopt::error::{Error, RankErrors, Result};

/// Longest message a thrown error carries: a message that echoes a caller's huge value is cut
/// (its start and its end kept).
const MAX_MESSAGE_CHARS: usize = 1024;

/// A library error as a JS `Error` named after its Python class.
pub(crate) fn js_error(error: Error) -> JsValue {
    let message = error.message();
    let js = if message.chars().count() > MAX_MESSAGE_CHARS {
        let head: String = message.chars().take(MAX_MESSAGE_CHARS - 100).collect();
        let tail: String = {
            let rev: Vec<char> = message.chars().rev().take(60).collect();
            rev.into_iter().rev().collect()
        };
        js_sys::Error::new(&format!("{head} … (message cut) … {tail}"))
    } else {
        js_sys::Error::new(message)
    };
    js.set_name(error.kind().name());
    js.into()
}

/// The errors of a call every rank made, as one JS `Error`: the lowest rank's name and
/// message, and `rankErrors`, every raising rank's `{rank, name, message}`.
pub(crate) fn js_rank_errors(errors: RankErrors) -> JsValue {
    let list = Array::new();
    for (rank, error) in errors.iter() {
        let entry = Object::new();
        convert::set(&entry, "rank", rank as f64);
        convert::set(&entry, "name", error.kind().name());
        convert::set(&entry, "message", error.message());
        list.push(&entry);
    }
    let js = js_error(errors.first().clone());
    let _ = js_sys::Reflect::set(&js, &JsValue::from_str("rankErrors"), &list);
    js
}

/// Converts a library result whose failure is per rank for JS (a CPU worker's panic during
/// the call first, as [`js`]).
pub(crate) fn js_ranks<T>(result: std::result::Result<T, RankErrors>) -> JsResult<T> {
    worker_panic()?;
    result.map_err(js_rank_errors)
}

/// `Result` at the JS boundary: the error is a thrown JS value.
pub(crate) type JsResult<T> = std::result::Result<T, JsValue>;

/// Converts a library result for JS. A part of a CPU kernel that panicked on a worker thread
/// of the threaded build (`distopt::backend::cpu::pool`) while the call ran makes the call a
/// `RuntimeError` whatever it returned: its answer is incomplete.
pub(crate) fn js<T>(result: Result<T>) -> JsResult<T> {
    worker_panic()?;
    result.map_err(js_error)
}

/// The `RuntimeError` for a part that panicked on one of the CPU pool's worker threads since
/// the last check (the worker is gone; the module and the other workers carry on).
fn worker_panic() -> JsResult<()> {
    match distopt::backend::cpu::pool::GLOBAL.take_panic() {
        None => Ok(()),
        Some(panic) => Err(js_error(Error::runtime(format!(
            "a worker thread of distopt's CPU backend panicked (a bug, please report it): {}; the call's results are incomplete, and the other threads carry on",
            panic.message().replace('\n', " ")
        )))),
    }
}

/// A promise of `future`'s result whose work starts now: the future is polled once before
/// this returns, so that it takes its borrows and reads (or changes) the data as of the call,
/// in call order with the synchronous calls that follow; what it still awaits (a GPU
/// readback) settles the promise later, the borrows held until then (a change meanwhile is
/// refused as busy). A failure at once is a rejected promise.
pub(crate) fn promise_now<F>(future: F) -> js_sys::Promise
where
    F: std::future::Future<Output = JsResult<JsValue>> + 'static,
{
    use std::task::{Context, Poll, Waker};
    let mut future = Box::pin(future);
    // The futures polled later re-register the executor's waker (`oneshot`, `JsFuture`).
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(value)) => js_sys::Promise::resolve(&value),
        Poll::Ready(Err(error)) => js_sys::Promise::reject(&error),
        Poll::Pending => wasm_bindgen_futures::future_to_promise(future),
    }
}

/// The error for an object that a pending asynchronous call still holds.
pub(crate) fn busy(what: &str) -> Error {
    Error::runtime(format!(
        "the {what} is busy: an earlier asynchronous call on it (a read, a step, a state_dict) has not finished; await it first"
    ))
}
