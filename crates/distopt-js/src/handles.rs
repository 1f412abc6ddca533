//! Finding the Rust object behind a JS object passed as an argument.
//!
//! wasm-bindgen's typed parameters (`&World`) reject a wrong or freed object with a plain
//! `Error`; distopt's arguments are `JsValue`s instead, resolved here through a per-class
//! registry of live objects, so that misuse is a `TypeError` like every other argument error.
//! Each class exposes its id through a getter (`__distoptWorldId`, …); the registry holds weak
//! references, so it never keeps a freed object alive.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use wasm_bindgen::JsValue;

use distopt::error::{Error, Result};

/// Live objects of one class, by id.
pub(crate) struct Registry<T> {
    next: Cell<u32>,
    live: RefCell<Vec<(u32, Weak<T>)>>,
}

impl<T> Registry<T> {
    /// An empty registry.
    pub(crate) const fn new() -> Registry<T> {
        Registry {
            next: Cell::new(1),
            live: RefCell::new(Vec::new()),
        }
    }

    /// Registers `object`; returns its id.
    pub(crate) fn register(&self, object: &Rc<T>) -> u32 {
        let id = self.next.get();
        self.next.set(id.wrapping_add(1).max(1));
        let mut live = self.live.borrow_mut();
        live.retain(|(_, w)| w.strong_count() > 0);
        live.push((id, Rc::downgrade(object)));
        id
    }

    /// The live object behind `value` (a JS object whose `getter` returns its id).
    pub(crate) fn resolve(&self, value: &JsValue, getter: &str, what: &str) -> Result<Rc<T>> {
        let id = super::convert::get(value, getter).as_f64();
        id.and_then(|id| {
            self.live
                .borrow()
                .iter()
                .find(|(i, _)| f64::from(*i) == id)
                .and_then(|(_, w)| w.upgrade())
        })
        .ok_or_else(|| Error::type_error(format!("{what} (and not freed)")))
    }
}
