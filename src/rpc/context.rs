//! Distributed autograd contexts: ids whose lifetime bounds the gradients recorded in them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// A context id, as `dist_autograd.context()` yields it.
pub type ContextId = u64;

/// The live contexts of a world.
#[derive(Debug, Default)]
pub(crate) struct Contexts {
    next: AtomicU64,
    live: Mutex<HashSet<ContextId>>,
}

impl Contexts {
    pub(crate) fn create(self: &Arc<Self>) -> AutogradContext {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
        AutogradContext {
            id,
            contexts: self.clone(),
        }
    }

    /// A `RuntimeError` unless `id` is a live context.
    pub(crate) fn check(&self, id: ContextId) -> Result<()> {
        if self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
        {
            Ok(())
        } else {
            Err(Error::runtime(format!(
                "Could not find autograd context with id: {id}"
            )))
        }
    }

    fn release(&self, id: ContextId) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// A live distributed autograd context; dropping it releases the context and its gradients.
#[derive(Debug)]
pub struct AutogradContext {
    id: ContextId,
    contexts: Arc<Contexts>,
}

impl AutogradContext {
    /// The context id.
    pub fn id(&self) -> ContextId {
        self.id
    }
}

impl Drop for AutogradContext {
    fn drop(&mut self) {
        self.contexts.release(self.id);
    }
}
