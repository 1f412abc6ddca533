//! The part every optimizer shares: parameter groups with typed options, PyTorch's checks of
//! them, the per-(rank, parameter) state counters, the state arenas' bookkeeping and the
//! `state_dict()` / `load_state_dict()` skeleton, and the step loop (a kernel table per format
//! bucket, one kernel call per bucket, the counters). An optimizer supplies only its math (an
//! [`OptimizerMath`]: its options type, its state arenas, its table entry, its kernel call, its
//! counter rule and its state entries).

use serde_json::{Map, Value, json};

use super::kind::OptimizerKind;
use super::local::LocalOptimizer;
use super::options::{self, GroupOptions, OptionMap};
use crate::backend::{BoxFuture, MaybeSendSync};
use crate::dtype::DType;
use crate::error::{Error, ErrorKind, Result};
use crate::replicas::{Replicas, StateArenas, check_param_index};

/// The warning of a parameter listed twice in one group (PyTorch's `add_param_group`); the
/// parameter is then optimized once.
pub const DUPLICATE_WARNING: &str = "optimizer contains a parameter group with duplicate parameters; in future, this will cause an error; see github.com/pytorch/pytorch/issues/40967 for more information";

/// One parameter group: global parameter indices, typed options, and the options as
/// `state_dict()["param_groups"]` prints them.
#[derive(Debug, Clone)]
pub struct ParamGroup<O> {
    params: Vec<usize>,
    options: O,
    map: OptionMap,
}

impl<O> ParamGroup<O> {
    /// The group's global parameter indices, in order, each once.
    pub fn params(&self) -> &[usize] {
        &self.params
    }

    /// The group's typed options.
    pub fn options(&self) -> &O {
        &self.options
    }

    /// The group's complete options by PyTorch's keyword names.
    pub fn map(&self) -> &OptionMap {
        &self.map
    }
}

/// The shared state of an optimizer: its class, groups, defaults, and one counter per
/// (rank, parameter) that the algorithm defines (SGD: 1 when a momentum buffer exists; Adam:
/// the step count). 0 means "no state", which `state_dict()` omits.
#[derive(Debug)]
pub struct Shell<O> {
    kind: OptimizerKind,
    groups: Vec<ParamGroup<O>>,
    defaults: OptionMap,
    ranks: usize,
    params: usize,
    /// The group of each replica parameter (`None`: not optimized).
    group_of: Vec<Option<usize>>,
    counts: Vec<u64>,
}

impl<O: GroupOptions> Shell<O> {
    fn new(
        kind: OptimizerKind,
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
    ) -> Result<Shell<O>> {
        if kind == OptimizerKind::AdamW && defaults.contains_key("decoupled_weight_decay") {
            // AdamW's constructor has no such keyword (it is always true).
            return Err(Error::type_error(
                "AdamW.__init__() got an unexpected keyword argument 'decoupled_weight_decay'",
            ));
        }
        let defaults = options::merge(kind.name(), &O::defaults(kind), defaults)?;
        O::from_map(&defaults)?.validate()?;
        if groups.is_empty() {
            return Err(Error::value("optimizer got an empty parameter list"));
        }
        let mut shell = Shell {
            kind,
            groups: Vec::with_capacity(groups.len()),
            defaults,
            ranks: replicas.ranks(),
            params: replicas.len(),
            group_of: vec![None; replicas.len()],
            counts: vec![0; replicas.ranks() * replicas.len()],
        };
        for (params, given) in groups {
            shell.add_group(params, &given)?;
        }
        options::check_fused(&shell.defaults)?;
        Ok(shell)
    }

    /// PyTorch's `add_param_group`: options over the defaults, the duplicate warning, and the
    /// `ValueError` for a parameter another group holds. Nothing changes on an error.
    fn add_group(&mut self, params: Vec<usize>, given: &OptionMap) -> Result<()> {
        for &j in &params {
            check_param_index(j, self.params)?;
        }
        let map = options::merge(self.kind.name(), &self.defaults, given)?;
        let options = O::from_map(&map)?;
        let mut unique = Vec::with_capacity(params.len());
        for &j in &params {
            if !unique.contains(&j) {
                unique.push(j);
            }
        }
        if unique.len() != params.len() {
            crate::warnings::warn(DUPLICATE_WARNING);
        }
        if unique.iter().any(|&j| self.group_of[j].is_some()) {
            return Err(Error::value(
                "some parameters appear in more than one parameter group",
            ));
        }
        for &j in &unique {
            self.group_of[j] = Some(self.groups.len());
        }
        self.groups.push(ParamGroup {
            params: unique,
            options,
            map,
        });
        Ok(())
    }

    /// The optimizer's class.
    pub fn kind(&self) -> OptimizerKind {
        self.kind
    }

    /// The parameter groups.
    pub fn groups(&self) -> &[ParamGroup<O>] {
        &self.groups
    }

    /// The options of replica parameter `j` (`None` when no group holds it).
    pub fn options_of(&self, j: usize) -> Option<&O> {
        self.group_index(j).map(|g| &self.groups[g].options)
    }

    /// The index of the param group holding replica parameter `j` (`None` when none does).
    pub fn group_index(&self, j: usize) -> Option<usize> {
        self.group_of.get(j).copied().flatten()
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The number of replica parameters.
    pub fn params(&self) -> usize {
        self.params
    }

    /// The counter of (rank, parameter `j`); 0: no state.
    pub fn count(&self, rank: usize, j: usize) -> u64 {
        self.counts[rank * self.params + j]
    }

    /// Sets the counter of (rank, parameter `j`).
    pub fn set_count(&mut self, rank: usize, j: usize, count: u64) {
        self.counts[rank * self.params + j] = count;
    }

    /// A `ValueError` unless `replicas` has the ranks and parameters this optimizer was built
    /// for.
    fn check_model(&self, replicas: &Replicas) -> Result<()> {
        if replicas.ranks() != self.ranks || replicas.len() != self.params {
            return Err(Error::value(format!(
                "this optimizer was built for {} ranks of {} parameters, not {} ranks of {}",
                self.ranks,
                self.params,
                replicas.ranks(),
                replicas.len()
            )));
        }
        Ok(())
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.ranks {
            return Err(Error::new(
                ErrorKind::IndexError,
                format!("rank {rank} out of range for {} ranks", self.ranks),
            ));
        }
        Ok(())
    }

    /// `(global index, optimizer-local index)` of every optimized parameter, in the groups'
    /// order (PyTorch numbers `state_dict()["state"]` so).
    fn numbered(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.groups
            .iter()
            .flat_map(|g| g.params.iter().copied())
            .enumerate()
            .map(|(k, j)| (j, k))
    }

    /// `state_dict()["param_groups"]`: every group's options plus `params`, the
    /// optimizer-local indices.
    fn param_groups_json(&self) -> Vec<Value> {
        let mut next = 0;
        self.groups
            .iter()
            .map(|group| {
                let mut map = group.map.clone();
                let len = group.params.len();
                map.insert(
                    "params".into(),
                    Value::from((next..next + len).collect::<Vec<_>>()),
                );
                next += len;
                Value::Object(map)
            })
            .collect()
    }

    /// Checks the loaded groups against ours, as PyTorch does (count and sizes), refuses the
    /// groups of another optimizer class, and parses the loaded options: the new groups, to
    /// be committed once everything else has been checked.
    fn parse_loaded_groups(&self, state_dict: &Value) -> Result<Vec<ParamGroup<O>>> {
        let saved = loaded_param_groups(state_dict, self.groups.len())?;
        let mut out = Vec::with_capacity(saved.len());
        for (index, (group, mine)) in saved.iter().zip(&self.groups).enumerate() {
            let Value::Object(group) = group else {
                return Err(Error::value(format!(
                    "loaded state dict's parameter group {index} is not a dict"
                )));
            };
            check_loaded_group_size(group.get("params"), mine.params.len())?;
            self.check_class(index, group)?;
            let mut map = mine.map.clone();
            for (key, value) in group {
                if key != "params" {
                    map.insert(key.clone(), value.clone());
                }
            }
            let options = O::from_map(&map)?;
            out.push(ParamGroup {
                params: mine.params.clone(),
                options,
                map,
            });
        }
        Ok(out)
    }

    /// A `ValueError` when a loaded group has an option of another optimizer class and not of
    /// ours (PyTorch would load it and fail, or silently lose state, at the next step).
    fn check_class(&self, index: usize, group: &Map<String, Value>) -> Result<()> {
        let ours = O::defaults(self.kind);
        for key in group.keys() {
            if key == "params" || ours.contains_key(key) {
                continue;
            }
            let decoupled = group
                .get("decoupled_weight_decay")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let other = OptimizerKind::ALL.into_iter().find(|&k| {
                k != self.kind
                    && super::defaults::defaults_of(k).contains_key(key)
                    && (k != OptimizerKind::Adam || !decoupled)
                    && (k != OptimizerKind::AdamW || decoupled)
            });
            if let Some(other) = other {
                return Err(Error::value(format!(
                    "cannot load a state dict of {other} into {}: its parameter group {index} has the option '{key}', which {} does not have",
                    self.kind, self.kind
                )));
            }
        }
        Ok(())
    }
}

/// An optimizer's math: its options, its state arenas (a [`crate::replicas::StateArenas`]
/// per state tensor, one arena per format bucket of the replicas, created on first use), its
/// step, and its entries of `state_dict()["state"]`. [`Optimizer`] wraps it into a
/// [`LocalOptimizer`]. Sealed: implemented by the crate's optimizers only.
pub trait OptimizerMath:
    super::sealed::Sealed + MaybeSendSync + std::fmt::Debug + Sized + 'static
{
    /// The typed options of one group.
    type Options: GroupOptions;
    /// One parameter's loaded state, parsed and checked, ready to be written.
    type Loaded;

    /// One (rank, parameter) entry of the kernel's table (`Default`: an entry the kernel skips,
    /// for a parameter the optimizer does not hold).
    type Scalars: Copy + Default;

    /// No state yet, for replicas of `buckets` format buckets.
    fn empty(buckets: usize) -> Self;

    /// Every state tensor's arenas (for copies of a whole rank's state).
    fn state_arenas_mut(&mut self) -> Vec<&mut StateArenas>;

    /// The table entry of a parameter under `options` whose counter is `count` (steps taken,
    /// as the shell keeps it), with a gradient on this rank or not; `(numel, dtype)` is the
    /// parameter's.
    fn scalars(
        options: &Self::Options,
        count: u64,
        has_grad: bool,
        param: (usize, DType),
    ) -> Self::Scalars;

    /// Settles one rank's entries of a format bucket's table once all are built, `group(k)`
    /// being the param group of entry `k` (for what depends on the other parameters of a group
    /// and dtype, as PyTorch's multi-tensor paths do). Default: nothing to settle.
    fn settle(_entries: &mut [Self::Scalars], _group: impl Fn(usize) -> Option<usize>) {}

    /// Whether the kernel updates the parameter of `entry`.
    fn active(entry: &Self::Scalars) -> bool;

    /// The counter after a step that updated the parameter of `entry` (`count` before it).
    fn counted(entry: &Self::Scalars, count: u64) -> u64;

    /// Runs the kernel once over format bucket `bucket` of `replicas` with its table (rank-major,
    /// one entry per (rank, member), at least one of them active), first creating the state
    /// arenas the active entries need.
    ///
    /// # Errors
    /// A failure to allocate a state arena, or a backend failure.
    fn run(
        &mut self,
        replicas: &mut Replicas,
        bucket: usize,
        table: &[Self::Scalars],
    ) -> Result<()>;

    /// Bytes of state allocated per rank.
    fn state_bytes_per_rank(&self) -> usize;

    /// The state of parameter `j` on `rank` as PyTorch's `state_dict()` lists it, or `None`
    /// when it has none. Called only where the shell's counter is non-zero.
    fn state_entry<'a>(
        &'a self,
        shell: &'a Shell<Self::Options>,
        replicas: &'a Replicas,
        rank: usize,
        j: usize,
    ) -> BoxFuture<'a, Result<Option<Map<String, Value>>>>;

    /// Parses and checks a loaded state entry of parameter `j` (optimizer-local index
    /// `local`), without changing anything.
    ///
    /// # Errors
    /// A `ValueError` or `TypeError` naming what is wrong.
    fn parse_entry(
        replicas: &Replicas,
        j: usize,
        local: usize,
        entry: &Value,
    ) -> Result<Self::Loaded>;

    /// Writes a parsed entry (`None`: the parameter has no state) and sets the counter.
    ///
    /// # Errors
    /// A failure to allocate a state arena.
    fn commit_entry(
        &mut self,
        shell: &mut Shell<Self::Options>,
        replicas: &Replicas,
        rank: usize,
        j: usize,
        loaded: Option<Self::Loaded>,
    ) -> Result<()>;
}

/// A local optimizer: the shared [`Shell`] plus an [`OptimizerMath`]'s state.
#[derive(Debug)]
pub struct Optimizer<A: OptimizerMath> {
    shell: Shell<A::Options>,
    algorithm: A,
}

impl<A: OptimizerMath> Optimizer<A> {
    /// An optimizer of class `kind` over `groups` of global parameter indices, each with its
    /// own options over `defaults` (PyTorch's keyword names).
    ///
    /// # Errors
    /// PyTorch's: a `TypeError` for an unknown keyword, a `ValueError` for an invalid
    /// hyper-parameter, an empty parameter list or a parameter in two groups; an `IndexError`
    /// for an index outside the replicas.
    pub fn with_groups(
        kind: OptimizerKind,
        replicas: &Replicas,
        groups: Vec<(Vec<usize>, OptionMap)>,
        defaults: &OptionMap,
    ) -> Result<Self> {
        Ok(Optimizer {
            shell: Shell::new(kind, replicas, groups, defaults)?,
            algorithm: A::empty(replicas.buckets().len()),
        })
    }

    /// The optimizer's class.
    pub fn kind(&self) -> OptimizerKind {
        self.shell.kind
    }

    /// The parameter groups with their typed options.
    pub fn groups(&self) -> &[ParamGroup<A::Options>] {
        &self.shell.groups
    }
}

/// A parsed state dict: the new groups and every optimized parameter's parsed entry.
type ParsedStateDict<A> = (
    Vec<ParamGroup<<A as OptimizerMath>::Options>>,
    Vec<(usize, Option<<A as OptimizerMath>::Loaded>)>,
);

impl<A: OptimizerMath> Optimizer<A> {
    /// Parses and checks a state dict for rank `rank` without changing anything.
    fn parse_state_dict(
        &self,
        replicas: &Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<ParsedStateDict<A>> {
        self.shell.check_model(replicas)?;
        self.shell.check_rank(rank)?;
        if !state_dict.is_object() {
            return Err(Error::type_error("state_dict must be a dict"));
        }
        let groups = self.shell.parse_loaded_groups(state_dict)?;
        let empty = Map::new();
        let state = match state_dict.get("state") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(state)) => state,
            Some(_) => return Err(Error::type_error("state_dict[\"state\"] must be a dict")),
        };
        let mut loaded = Vec::new();
        for (j, k) in self.shell.numbered() {
            let entry = match state.get(&k.to_string()) {
                None | Some(Value::Null) => None,
                Some(entry) => Some(A::parse_entry(replicas, j, k, entry)?),
            };
            loaded.push((j, entry));
        }
        Ok((groups, loaded))
    }
}

/// Every replica parameter as one group with no options of its own (`SGD(model.parameters())`).
pub(crate) fn all_params(replicas: &Replicas) -> Vec<(Vec<usize>, OptionMap)> {
    if replicas.is_empty() {
        return Vec::new();
    }
    vec![((0..replicas.len()).collect(), OptionMap::new())]
}

impl<A: OptimizerMath> LocalOptimizer for Optimizer<A> {
    fn name(&self) -> &'static str {
        self.shell.kind.name()
    }

    fn kind(&self) -> OptimizerKind {
        self.shell.kind
    }

    /// The step loop every optimizer shares: one table of [`OptimizerMath::scalars`] per format
    /// bucket, one [`OptimizerMath::run`] per bucket with an active entry, then the counters of
    /// the updated parameters advance ([`OptimizerMath::counted`]).
    fn step(&mut self, replicas: &mut Replicas) -> Result<()> {
        self.shell.check_model(replicas)?;
        let ranks = self.shell.ranks();
        let tables: Vec<Vec<A::Scalars>> = replicas
            .buckets()
            .iter()
            .map(|bucket| {
                let members = bucket.members();
                let mut table = vec![A::Scalars::default(); ranks * members.len()];
                for (rank, entries) in table.chunks_mut(members.len().max(1)).enumerate() {
                    for (k, &j) in members.iter().enumerate() {
                        if let Some(options) = self.shell.options_of(j) {
                            entries[k] = A::scalars(
                                options,
                                self.shell.count(rank, j),
                                replicas.has_grad(rank, j),
                                (replicas.numel(j), replicas.dtype(j)),
                            );
                        }
                    }
                    A::settle(entries, |k| self.shell.group_index(members[k]));
                }
                table
            })
            .collect();
        for (b, table) in tables.iter().enumerate() {
            if !table.iter().any(A::active) {
                continue;
            }
            self.algorithm.run(replicas, b, table)?;
            let members = replicas.buckets()[b].members();
            for rank in 0..ranks {
                for (k, &j) in members.iter().enumerate() {
                    let entry = &table[rank * members.len() + k];
                    if A::active(entry) {
                        let count = A::counted(entry, self.shell.count(rank, j));
                        self.shell.set_count(rank, j, count);
                    }
                }
            }
        }
        Ok(())
    }

    fn check_model(&self, replicas: &Replicas) -> Result<()> {
        self.shell.check_model(replicas)
    }

    fn param_groups(&self) -> Vec<Vec<usize>> {
        self.shell.groups.iter().map(|g| g.params.clone()).collect()
    }

    fn group_options(&self) -> Vec<OptionMap> {
        self.shell.groups.iter().map(|g| g.map.clone()).collect()
    }

    fn add_param_group(&mut self, params: Vec<usize>, options: &OptionMap) -> Result<()> {
        self.shell.add_group(params, options)
    }

    fn state_dict<'a>(
        &'a self,
        replicas: &'a Replicas,
        rank: usize,
    ) -> BoxFuture<'a, Result<Value>> {
        Box::pin(async move {
            self.shell.check_model(replicas)?;
            self.shell.check_rank(rank)?;
            let mut state = Map::new();
            for (j, k) in self.shell.numbered() {
                if self.shell.count(rank, j) == 0 {
                    continue;
                }
                if let Some(entry) = self
                    .algorithm
                    .state_entry(&self.shell, replicas, rank, j)
                    .await?
                {
                    state.insert(k.to_string(), Value::Object(entry));
                }
            }
            Ok(json!({"state": state, "param_groups": self.shell.param_groups_json()}))
        })
    }

    fn check_state_dict(&self, replicas: &Replicas, rank: usize, state_dict: &Value) -> Result<()> {
        self.parse_state_dict(replicas, rank, state_dict)
            .map(|_| ())
    }

    fn load_state_dict(
        &mut self,
        replicas: &mut Replicas,
        rank: usize,
        state_dict: &Value,
    ) -> Result<()> {
        // Everything is parsed and checked first; only then is anything changed.
        let (groups, loaded) = self.parse_state_dict(replicas, rank, state_dict)?;
        for (j, entry) in loaded {
            self.algorithm
                .commit_entry(&mut self.shell, replicas, rank, j, entry)?;
        }
        self.shell.groups = groups;
        Ok(())
    }

    fn heal_rank_state(
        &mut self,
        world: &dyn crate::comm::Communicator,
        replicas: &Replicas,
        source: usize,
        joiner: usize,
    ) -> Result<()> {
        self.shell.check_model(replicas)?;
        for state in self.algorithm.state_arenas_mut() {
            state.heal(world, replicas, source, joiner)?;
        }
        let local = world.local_ranks();
        let params = self.shell.params;
        let counts: Vec<u8> = if local.contains(&source) {
            (0..params)
                .flat_map(|j| self.shell.count(source - local.start, j).to_le_bytes())
                .collect()
        } else {
            Vec::new()
        };
        let counts = world.heal_bytes(source, joiner, counts)?;
        if local.contains(&joiner) {
            if counts.len() != params * 8 {
                return Err(Error::runtime(format!(
                    "rank {source} heals rank {joiner} with {} bytes of step counters, {params} parameters need {}",
                    counts.len(),
                    params * 8
                )));
            }
            for (j, count) in counts.chunks_exact(8).enumerate() {
                let count = u64::from_le_bytes(count.try_into().expect("8 bytes"));
                self.shell.set_count(joiner - local.start, j, count);
            }
        }
        Ok(())
    }

    fn state_bytes_per_rank(&self) -> usize {
        self.algorithm.state_bytes_per_rank()
    }

    fn state_len(&self, rank: usize) -> usize {
        if rank >= self.shell.ranks {
            return 0;
        }
        (0..self.shell.params)
            .filter(|&j| self.shell.count(rank, j) > 0)
            .count()
    }
}

/// The `"param_groups"` list of a loaded state dict, checked to hold `count` groups, as
/// PyTorch's `load_state_dict` checks it.
///
/// # Errors
/// A `ValueError` when there is no such list or it holds another number of groups.
pub(crate) fn loaded_param_groups(state_dict: &Value, count: usize) -> Result<&Vec<Value>> {
    let saved = state_dict
        .get("param_groups")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::value("state dict has no \"param_groups\" list"))?;
    if saved.len() != count {
        return Err(Error::value(
            "loaded state dict has a different number of parameter groups",
        ));
    }
    Ok(saved)
}

/// PyTorch's check that a loaded group's `params` (a list, or missing: none) are as many as
/// the `len` of the group it loads into.
///
/// # Errors
/// PyTorch's `ValueError` when they are not.
pub(crate) fn check_loaded_group_size(params: Option<&Value>, len: usize) -> Result<()> {
    if params.and_then(Value::as_array).map_or(0, Vec::len) != len {
        return Err(Error::value(
            "loaded state dict contains a parameter group that doesn't match the size of optimizer's group",
        ));
    }
    Ok(())
}

/// A loaded state tensor, checked to fit parameter `j` and encoded for its arena (cast to the
/// parameter's dtype, as PyTorch's `load_state_dict` casts state to its parameter's dtype).
pub(crate) fn parse_state_tensor(
    replicas: &Replicas,
    j: usize,
    value: &Value,
    what: &str,
) -> Result<Vec<u32>> {
    let tensor = crate::json::tensor_from_json(value, what)?;
    if tensor.numel() != replicas.numel(j) {
        return Err(Error::value(format!(
            "loaded state of shape {} does not fit a parameter of shape {}",
            crate::tensor::format_shape(tensor.shape()),
            crate::tensor::format_shape(replicas.shape(j))
        )));
    }
    let format = replicas.buckets()[replicas.place(j).bucket].format();
    crate::transfer::encode(&tensor, format, "loaded state")
}
