//! PyTorch's sorted-greedy assignment of parameters to ranks (`_partition_parameters`).

/// Which rank owns which parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// `rank_of_param[i]`: the owner of global parameter `i`.
    pub rank_of_param: Vec<usize>,
    /// `params_per_rank[r]`: the global indices rank `r` owns, group by group, each group in
    /// assignment order (largest first, ties in input order). This is the order of the rank's
    /// local optimizer and of its bucket.
    pub params_per_rank: Vec<Vec<usize>>,
    /// `params_per_rank_per_group[r][g]`: the same, split by parameter group.
    pub params_per_rank_per_group: Vec<Vec<Vec<usize>>>,
    /// Elements each rank owns.
    pub numel_per_rank: Vec<usize>,
}

/// Assigns the parameters of `groups` (each a list of element counts, global indices running
/// across groups in order) to `world_size` ranks: one running size per rank shared by all
/// groups; each group sorted by element count, largest first (stable); each parameter to the
/// first rank of least size.
///
/// ```
/// use distopt::zero::partition;
/// let p = partition(2, &[vec![3, 5, 2]]);
/// assert_eq!(p.rank_of_param, vec![1, 0, 1]);
/// assert_eq!(p.params_per_rank, vec![vec![1], vec![0, 2]]);
/// ```
pub fn partition(world_size: usize, groups: &[Vec<usize>]) -> Partition {
    let world_size = world_size.max(1);
    let mut sizes = vec![0usize; world_size];
    let total: usize = groups.iter().map(Vec::len).sum();
    let mut rank_of_param = vec![0usize; total];
    let mut per_group = vec![vec![Vec::new(); groups.len()]; world_size];
    let mut first = 0;
    for (g, numels) in groups.iter().enumerate() {
        let mut order: Vec<usize> = (0..numels.len()).collect();
        // Python's sorted(reverse=True) is stable: equal sizes keep their input order.
        order.sort_by(|&a, &b| numels[b].cmp(&numels[a]));
        for k in order {
            let rank = (0..world_size)
                .min_by_key(|&r| (sizes[r], r))
                .expect("at least one rank");
            rank_of_param[first + k] = rank;
            per_group[rank][g].push(first + k);
            sizes[rank] += numels[k];
        }
        first += numels.len();
    }
    Partition {
        rank_of_param,
        params_per_rank: per_group.iter().map(|groups| groups.concat()).collect(),
        params_per_rank_per_group: per_group,
        numel_per_rank: sizes,
    }
}
