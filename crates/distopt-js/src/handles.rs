//! Finding the Rust object behind a JS object passed as an argument.
//!
//! wasm-bindgen's typed parameters (`&World`) reject a wrong or freed object with a plain
//! `Error`, and cannot take one of several classes or an element of a list; distopt's arguments
//! are `JsValue`s instead, resolved here so that misuse is a `TypeError` like every other
//! argument error. There is no registry of ids: each class has an internal method
//! (`__distoptWorld`, …) that hands its Rust object over to [`resolve`], so the object behind an
//! argument is found through wasm-bindgen's own reference to it, the one identity there is.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::{JsCast, JsValue};

use distopt::error::{Error, Result};

thread_local! {
    /// The object a class's internal method handed over, until [`resolve`] takes it.
    static HANDED: RefCell<Option<Rc<dyn Any>>> = const { RefCell::new(None) };
}

/// What each class's internal method does: hands `object`, its Rust object, to the [`resolve`]
/// call that asked for it.
pub(crate) fn hand_over(object: Rc<dyn Any>) {
    HANDED.with(|handed| *handed.borrow_mut() = Some(object));
}

/// The live object of type `T` behind `value`: a JS object whose class's method `method` hands
/// it over, or a `TypeError` "`what` (and not freed)".
///
/// Which objects are distopt's is decided once, by the npm package's argument layer (its record
/// of the objects the module made): it passes those as they are, and copies every other object
/// into a fresh one without a prototype. Here the method must come from the object's class, not
/// be a property of its own, so that a copied method (`{__distoptWorld: world.__distoptWorld}`)
/// is a `TypeError`, never taken for the object it came from.
pub(crate) fn resolve<T: Any>(value: &JsValue, method: &str, what: &str) -> Result<Rc<T>> {
    handed_over(value, method)
        .and_then(|object| object.downcast::<T>().ok())
        .ok_or_else(|| Error::type_error(format!("{what} (and not freed)")))
}

/// What `value`'s class method `method` hands over, if it is one. Anything that throws while
/// looked at or called (a freed object's method does) hands over nothing.
fn handed_over(value: &JsValue, method: &str) -> Option<Rc<dyn Any>> {
    if !value.is_object() {
        return None;
    }
    let key = JsValue::from_str(method);
    let object: &js_sys::Object = value.unchecked_ref();
    let own = js_sys::Reflect::get_own_property_descriptor(object, &key).ok()?;
    if !own.is_undefined() {
        return None;
    }
    let function = js_sys::Reflect::get(value, &key)
        .ok()?
        .dyn_into::<js_sys::Function>()
        .ok()?;
    HANDED.with(|handed| handed.borrow_mut().take());
    function.call0(value).ok()?;
    HANDED.with(|handed| handed.borrow_mut().take())
}
