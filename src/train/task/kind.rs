//! [`TaskKind`]: the built-in tasks by name, for command lines and settings.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Dataset, DatasetConfig, DatasetTask, SyntheticTask, Task, TaskConfig};
use crate::error::{Error, Result};

/// The built-in tasks by name: `synthetic` or `digits` (`"digits".parse::<TaskKind>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskKind {
    /// [`SyntheticTask`] with the default [`TaskConfig`].
    Synthetic,
    /// [`DatasetTask::digits`]: the UCI hand-written digits, non-IID shards, 20 % held out.
    Digits,
}

impl TaskKind {
    /// Every built-in task.
    pub const ALL: [TaskKind; 2] = [TaskKind::Synthetic, TaskKind::Digits];

    /// `synthetic` or `digits`.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Synthetic => "synthetic",
            TaskKind::Digits => "digits",
        }
    }

    /// The task for `ranks` ranks with its default settings and seed `seed`.
    ///
    /// # Errors
    /// As [`SyntheticTask::new`] / [`DatasetTask::new`] (no ranks, too many ranks).
    pub fn build(self, ranks: usize, seed: u64) -> Result<Arc<dyn Task>> {
        Ok(match self {
            TaskKind::Synthetic => Arc::new(SyntheticTask::new(
                TaskConfig {
                    seed,
                    ..TaskConfig::default()
                },
                ranks,
            )?),
            TaskKind::Digits => Arc::new(DatasetTask::new(
                &Dataset::digits()?,
                DatasetConfig {
                    seed,
                    ..DatasetConfig::default()
                },
                ranks,
            )?),
        })
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TaskKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<TaskKind> {
        TaskKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::value(format!("unknown task '{s}': expected synthetic or digits"))
            })
    }
}
