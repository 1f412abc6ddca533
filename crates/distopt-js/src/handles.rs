//! Finding the Rust object behind a JS object passed as an argument.
//!
//! wasm-bindgen's typed parameters (`&World`) reject a wrong or freed object with a plain
//! `Error`; distopt's arguments are `JsValue`s instead, resolved here through a per-class
//! registry of live objects, so that misuse is a `TypeError` like every other argument error.
//! Each class exposes its id through a getter (`__distoptWorldId`, …); the registry holds weak
//! references, so it never keeps a freed object alive.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use wasm_bindgen::{JsCast, JsValue};

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

    /// The live object behind `value` (a JS object whose `getter` returns its id). Which
    /// objects are distopt's is decided once, by the npm package's argument layer (its record
    /// of the objects the module made): it passes those as they are, runs the class's getters
    /// only on them, and copies every other object into a fresh one without a prototype. Here
    /// the id must come from a getter of the object's class, not from a property of its own,
    /// so that a copied id (`{__distoptWorldId: 1}`) is a `TypeError`, never taken for the
    /// object it names.
    pub(crate) fn resolve(&self, value: &JsValue, getter: &str, what: &str) -> Result<Rc<T>> {
        let id = genuine(value, getter).then(|| super::convert::get(value, getter).as_f64());
        id.flatten()
            .and_then(|id| {
                self.live
                    .borrow()
                    .iter()
                    .find(|(i, _)| f64::from(*i) == id)
                    .and_then(|(_, w)| w.upgrade())
            })
            .ok_or_else(|| Error::type_error(format!("{what} (and not freed)")))
    }
}

/// Whether `value` is an object whose `getter` is not a property of its own (the class's
/// getters live on its prototype). Anything that throws while looked at is not.
fn genuine(value: &JsValue, getter: &str) -> bool {
    if !value.is_object() {
        return false;
    }
    let object: &js_sys::Object = value.unchecked_ref();
    js_sys::Reflect::get_own_property_descriptor(object, &JsValue::from_str(getter))
        .is_ok_and(|d| d.is_undefined())
}
