//! Groups of ranks: a partition of the world into contiguous groups, as
//! `torch.distributed.new_subgroups` makes them.

use crate::error::{Error, Result};

/// A partition of the world into contiguous groups `[k*g, (k+1)*g)`, as
/// `torch.distributed.new_subgroups(group_size=g)` makes them. `g == world_size` is the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subgroups {
    world_size: usize,
    group_size: usize,
}

impl Subgroups {
    /// The whole world as one group.
    pub fn world(world_size: usize) -> Subgroups {
        Subgroups {
            world_size,
            group_size: world_size,
        }
    }

    /// Ranks per group.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The ranks of the group that `rank` belongs to.
    pub fn group_of(&self, rank: usize) -> std::ops::Range<usize> {
        let first = rank / self.group_size * self.group_size;
        first..first + self.group_size
    }
}

/// `torch.distributed.new_subgroups(group_size)`: contiguous groups of `group_size` ranks, with
/// PyTorch's validation errors.
///
/// # Errors
/// PyTorch's `ValueError`s: `group_size` not positive, larger than `world_size`, or not a divisor
/// of it.
///
/// ```
/// use distopt::comm::new_subgroups;
/// assert_eq!(new_subgroups(4, 2).unwrap().group_of(3), 2..4);
/// let err = new_subgroups(4, 3).unwrap_err();
/// assert_eq!(err.message(), "The world size (4) must be divisible by 'group_size=3'");
/// ```
pub fn new_subgroups(world_size: usize, group_size: i64) -> Result<Subgroups> {
    if group_size <= 0 {
        return Err(Error::value(format!(
            "The arg 'group_size' ({group_size}) must be positive"
        )));
    }
    if group_size as u64 > world_size as u64 {
        return Err(Error::value(format!(
            "The arg 'group_size' ({group_size}) must not exceed the world size ({world_size})"
        )));
    }
    let group_size = group_size as usize;
    if !world_size.is_multiple_of(group_size) {
        return Err(Error::value(format!(
            "The world size ({world_size}) must be divisible by 'group_size={group_size}'"
        )));
    }
    Ok(Subgroups {
        world_size,
        group_size,
    })
}
