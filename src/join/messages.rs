//! PyTorch's texts of the join context: its errors and its skew warning.

/// `ValueError` of a context without joinables.
pub const NO_JOINABLES: &str = "The join context manager requires at least one joinable";
/// `ValueError` of joinables on different process groups.
pub const MULTIPLE_PROCESS_GROUPS: &str = "Using join context manager with multiple process groups";
/// `RuntimeError` of a rank that still had inputs, with `throw_on_early_termination`.
pub const EARLY_TERMINATION: &str =
    "Detected at least one rank that exhausted inputs. Throwing across all ranks.";
/// Shadow iterations after which a joined rank warns about the skew of the inputs.
pub const WARN_THRESHOLD: u64 = 1000;

/// `RuntimeError` of a rank that ran out of inputs, with `throw_on_early_termination`.
pub fn exhausted_message(rank: usize) -> String {
    format!("Rank {rank} exhausted all inputs.")
}

/// The `UserWarning` of a rank that has run more than [`WARN_THRESHOLD`] shadow iterations.
pub fn skew_warning(rank: usize) -> String {
    format!(
        "Detected uneven input skew of greater than {WARN_THRESHOLD}. This means that rank {rank} has at least {WARN_THRESHOLD} fewer inputs than other currently-active ranks. This level of skew could lead to performance degradation during training."
    )
}
