//! Argument checks shared by the worlds that hold one rank per process (`MpiWorld`,
//! `NatsWorld`): `holder` names such a process in their messages ("an MPI process", "a process
//! of a NATS run").

use crate::backend::Arena;
use crate::error::{Error, Result};

/// A `ValueError` unless `arena` holds one rank.
pub(crate) fn check_one_rank(arena: &Arena, what: &str, holder: &str) -> Result<()> {
    if arena.ranks() != 1 {
        return Err(Error::value(format!(
            "{what}: {holder} holds one rank, the arena has {}",
            arena.ranks()
        )));
    }
    Ok(())
}

/// The data of the one rank the process holds; a `ValueError` unless there is exactly one.
pub(crate) fn only_rank<'a, T>(per_local_rank: &'a [T], holder: &str) -> Result<&'a T> {
    match per_local_rank {
        [mine] => Ok(mine),
        _ => Err(Error::value(format!(
            "{holder} holds one rank, {} ranks' data passed",
            per_local_rank.len()
        ))),
    }
}
