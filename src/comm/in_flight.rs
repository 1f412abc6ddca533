//! An elastic sync point's mean that travels while the caller computes: what
//! [`Communicator::start_all_reduce_mean_live`](super::Communicator::start_all_reduce_mean_live)
//! hands back and
//! [`Communicator::finish_all_reduce_mean_live`](super::Communicator::finish_all_reduce_mean_live)
//! takes (Streaming DiLoCo's fragment in flight during its `fragment_sync_delay`).

use std::any::Any;

/// A mean in flight, or one already complete (a world that computes it at its start, such as
/// the simulated one). Dropping one that is in flight abandons it: the world never writes it
/// anywhere.
#[derive(Debug)]
pub struct InFlightMean(Option<Box<dyn Any + Send>>);

impl InFlightMean {
    /// A mean already in its arena: finishing it does nothing.
    pub fn done() -> InFlightMean {
        InFlightMean(None)
    }

    /// A mean a world is still computing, with what that world needs to finish it.
    pub fn travelling(state: Box<dyn Any + Send>) -> InFlightMean {
        InFlightMean(Some(state))
    }

    /// Whether the mean is already in its arena.
    pub fn is_done(&self) -> bool {
        self.0.is_none()
    }

    /// The world's state of a mean still in flight (`None` when done).
    pub fn into_state(self) -> Option<Box<dyn Any + Send>> {
        self.0
    }
}
