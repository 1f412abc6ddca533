//! The heals of an elastic averaging: a rank that joins at a sync point gets the averager's
//! step counter from the point's lowest live rank and its parameters from the lowest live rank
//! of its group (of the world when its group has none). The live ranks make them at the end of
//! the sync point ([`super::ModelAverager::average_parameters`]) and a process that joins makes
//! the same calls in the same order ([`super::ModelAverager::admit`]), so that a world of
//! processes carries them from one to the other ([`Communicator::heal_rows`],
//! [`Communicator::heal_bytes`]); where one process holds both ranks they are copies.

use crate::comm::{Communicator, Membership, Subgroups};
use crate::error::{Error, Result};
use crate::replicas::Replicas;

/// The heals of `membership`'s joining ranks within `groups`: `(joiner, source)` world ranks,
/// the source being the lowest live rank of the joiner's group, or of the world when its group
/// has none (a joiner with no live rank anywhere is not healed).
pub(crate) fn plan(groups: Subgroups, membership: &Membership) -> Vec<(usize, usize)> {
    membership
        .joining
        .iter()
        .filter_map(|&joiner| {
            groups
                .group_of(joiner)
                .find(|&rank| membership.live[rank])
                .or(membership.source())
                .map(|source| (joiner, source))
        })
        .collect()
}

/// Heals each `(joiner, source)` of `plan`: the joiner's parameters become the source's.
///
/// # Errors
/// Those of [`Communicator::heal_rows`].
pub(crate) fn params(
    world: &dyn Communicator,
    replicas: &mut Replicas,
    plan: &[(usize, usize)],
) -> Result<()> {
    for &(joiner, source) in plan {
        replicas.heal_params(world, source, joiner)?;
    }
    Ok(())
}

/// The averager's step counter once the sync point of `membership` is over, `step` on the
/// live ranks: each joiner gets the lowest live rank's. Returns the counter this process's
/// ranks have now (a process holding a joining rank and not its source gets the source's).
///
/// # Errors
/// Those of [`Communicator::heal_bytes`]; a `RuntimeError` when the source sends another
/// number of bytes than a counter's eight.
pub(crate) fn step(world: &dyn Communicator, membership: &Membership, step: u64) -> Result<u64> {
    let Some(source) = membership.source() else {
        return Ok(step);
    };
    let mut now = step;
    for &joiner in &membership.joining {
        let bytes = world.heal_bytes(source, joiner, step.to_le_bytes().to_vec())?;
        let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
            Error::runtime(format!(
                "rank {source} heals rank {joiner} with {} bytes of the averager's step counter, not 8",
                bytes.len()
            ))
        })?;
        if world.local_ranks().contains(&joiner) {
            now = u64::from_le_bytes(bytes);
        }
    }
    Ok(now)
}

/// The sync point that takes this process's ranks into a running run (a process that joins,
/// `distopt train --join`): the world's next membership, which must list one of them joining.
///
/// # Errors
/// The world's errors; a `RuntimeError` when that membership admits none of this process's
/// ranks or has no live rank to heal them from.
pub(crate) fn admission(world: &dyn Communicator) -> Result<Membership> {
    let membership = world.membership()?;
    let local = world.local_ranks();
    if membership.source().is_none() || !membership.joining.iter().any(|r| local.contains(r)) {
        return Err(Error::runtime(format!(
            "sync point {} did not admit this process's ranks ({}..{}): it holds no joining rank",
            membership.epoch, local.start, local.end
        )));
    }
    Ok(membership)
}
