//! An object of the JS API that a wrapper can take in: an optimizer moves into a
//! `PostLocalSGDOptimizer` or a `DiLoCo`, an averager into a `PostLocalSGDOptimizer` (as
//! PyTorch's wrappers own what they wrap). While it is its own, its JS object uses it; once
//! wrapped, the JS object reads it through the wrapper, which registers itself as its
//! [`Owner`], and refuses to change it.

use std::cell::{Ref, RefCell};
use std::rc::Rc;

use super::boundary::busy;
use distopt::error::{Error, Result};

/// A wrapper that a `T` moved into, as the wrapper registers itself with the wrapped object
/// ([`Slot::wrap`]): the wrapped object reads through it and names it in its errors, without
/// knowing which kinds of wrapper exist.
pub(crate) trait Owner<T: ?Sized> {
    /// The wrapper's JS class (`"PostLocalSGDOptimizer"`, `"DiLoCo"`).
    fn class(&self) -> &'static str;

    /// What to do instead of changing the wrapped object directly (the end of the error that
    /// refuses it: `"step and load it through that"`).
    fn refusal(&self) -> &'static str;

    /// The wrapped object, borrowed from the wrapper (`None` while the wrapper is in use).
    fn inner(&self) -> Option<Ref<'_, T>>;
}

/// Where the value is.
pub(crate) enum Place<T: ?Sized> {
    /// Its own.
    Own(Box<T>),
    /// Moved into a wrapper.
    Wrapped(Rc<dyn Owner<T>>),
    /// Only while being moved into a wrapper (or left by a wrapper whose constructor failed
    /// after taking it: its JS object then reports "busy" until freed).
    Moving,
}

impl<T: ?Sized> Place<T> {
    /// The value, its own or borrowed from its wrapper into `wrapped`.
    pub(crate) fn value<'p: 'w, 'w>(
        &'p self,
        wrapped: &'w mut Option<Ref<'p, T>>,
        kind: &str,
    ) -> Result<&'w T> {
        match self {
            Place::Own(value) => Ok(value.as_ref()),
            Place::Wrapped(owner) => {
                Ok(&**wrapped.insert(owner.inner().ok_or_else(|| busy(kind))?))
            }
            Place::Moving => Err(busy(kind)),
        }
    }
}

/// The value behind a JS object that a wrapper can take in.
pub(crate) struct Slot<T: ?Sized> {
    /// The object's JS class (`"SGD"`, `"PeriodicModelAverager"`).
    name: &'static str,
    /// What a "busy" error calls it (`"optimizer"`, `"averager"`).
    kind: &'static str,
    place: RefCell<Place<T>>,
}

impl<T: ?Sized> Slot<T> {
    /// `value`, owned, by an object of class `name` (a `kind`).
    pub(crate) fn new(name: &'static str, kind: &'static str, value: Box<T>) -> Slot<T> {
        Slot {
            name,
            kind,
            place: RefCell::new(Place::Own(value)),
        }
    }

    /// Where the value is, borrowed (see [`Place::value`]).
    pub(crate) fn place(&self) -> Result<Ref<'_, Place<T>>> {
        self.place.try_borrow().map_err(|_| busy(self.kind))
    }

    /// What "busy" errors call the value.
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// Runs `f` on the value, wherever it is.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Result<R> {
        let place = self.place()?;
        let mut wrapped = None;
        Ok(f(place.value(&mut wrapped, self.kind)?))
    }

    /// Runs `f` on the value it owns (an error once it is wrapped).
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut T) -> Result<R>) -> Result<R> {
        let mut place = self.place.try_borrow_mut().map_err(|_| busy(self.kind))?;
        match &mut *place {
            Place::Own(value) => f(value.as_mut()),
            Place::Wrapped(owner) => Err(Error::runtime(format!(
                "this {} belongs to a {}: {}",
                self.name,
                owner.class(),
                owner.refusal()
            ))),
            Place::Moving => Err(busy(self.kind)),
        }
    }

    /// Takes the value out to wrap it; [`Slot::restore`] puts it back, [`Slot::wrap`]
    /// registers the wrapper.
    pub(crate) fn take(&self) -> Result<Box<T>> {
        let mut place = self.place.try_borrow_mut().map_err(|_| busy(self.kind))?;
        match std::mem::replace(&mut *place, Place::Moving) {
            Place::Own(value) => Ok(value),
            Place::Wrapped(owner) => {
                let class = owner.class();
                *place = Place::Wrapped(owner);
                Err(Error::value(format!(
                    "this {} already belongs to a {class}",
                    self.name
                )))
            }
            Place::Moving => Err(Error::value(format!(
                "this {} already belongs to a PostLocalSGDOptimizer",
                self.name
            ))),
        }
    }

    /// Puts back a value [`Slot::take`] took, for a wrapper that could not be built.
    pub(crate) fn restore(&self, value: Box<T>) {
        self.set(Place::Own(value));
    }

    /// Registers the wrapper the value moved into.
    pub(crate) fn wrap(&self, owner: Rc<dyn Owner<T>>) {
        self.set(Place::Wrapped(owner));
    }

    fn set(&self, place: Place<T>) {
        if let Ok(mut p) = self.place.try_borrow_mut() {
            *p = place;
        }
    }
}
