//! An elastic sync point's mean that travels while the caller computes: what
//! [`Communicator::start_all_reduce_mean_in`](super::Communicator::start_all_reduce_mean_in)
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

/// A sync point's membership agreed while the caller computes: what
/// [`Communicator::start_membership`](super::Communicator::start_membership) hands back, to
/// start means over its live ranks before it is known
/// ([`Communicator::start_all_reduce_mean_in`](super::Communicator::start_all_reduce_mean_in))
/// and to read it at the end
/// ([`Communicator::finish_membership`](super::Communicator::finish_membership)).
#[derive(Debug)]
pub struct InFlightMembership(Result<super::Membership, Box<dyn Any + Send>>);

impl InFlightMembership {
    /// A membership already agreed.
    pub fn done(membership: super::Membership) -> InFlightMembership {
        InFlightMembership(Ok(membership))
    }

    /// A membership a world is still agreeing on, with what that world needs to read it.
    pub fn agreeing(state: Box<dyn Any + Send>) -> InFlightMembership {
        InFlightMembership(Err(state))
    }

    /// The membership, once agreed.
    pub fn agreed(&self) -> Option<&super::Membership> {
        self.0.as_ref().ok()
    }

    /// The world's state of a membership still being agreed on.
    pub fn state(&self) -> Option<&(dyn Any + Send)> {
        self.0.as_ref().err().map(|b| b.as_ref())
    }

    /// The membership, or the world's state while it is being agreed on.
    ///
    /// # Errors
    /// The world's state (not an error) while the membership is being agreed on.
    pub fn into_inner(self) -> Result<super::Membership, Box<dyn Any + Send>> {
        self.0
    }
}
