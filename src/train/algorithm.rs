//! The trainer's algorithms by the names every front end uses (the command line's
//! `--algorithm`, the JavaScript `Trainer`'s `algorithm`), with their settings and defaults in
//! one place.

use std::str::FromStr;

use super::Algorithm;
use crate::diloco::Compression;
use crate::error::{Error, Result};

/// An algorithm's name, as `--algorithm` and the JavaScript `Trainer` take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmName {
    /// Synchronous data-parallel SGD (`"sync"`).
    Sync,
    /// Post-local SGD with periodic model averaging (`"periodic"`).
    Periodic,
    /// Post-local SGD with hierarchical model averaging (`"hierarchical"`).
    Hierarchical,
    /// Synchronous SGD with a ZeRO-sharded optimizer (`"zero"`).
    Zero,
    /// DiLoCo, or Streaming DiLoCo with fragments (`"diloco"`).
    DiLoCo,
}

impl AlgorithmName {
    /// Every algorithm, in the order a comparison lists them.
    pub const ALL: [AlgorithmName; 5] = [
        AlgorithmName::Sync,
        AlgorithmName::Periodic,
        AlgorithmName::Hierarchical,
        AlgorithmName::Zero,
        AlgorithmName::DiLoCo,
    ];

    /// The name front ends use.
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmName::Sync => "sync",
            AlgorithmName::Periodic => "periodic",
            AlgorithmName::Hierarchical => "hierarchical",
            AlgorithmName::Zero => "zero",
            AlgorithmName::DiLoCo => "diloco",
        }
    }

    /// The algorithm with `settings` for `ranks` ranks.
    ///
    /// # Errors
    /// A `ValueError` for compression asked of another algorithm than DiLoCo. (The settings'
    /// values are checked where they are used, with PyTorch's texts: a period of 0 by the
    /// averager, as `Trainer::new` builds it.)
    pub fn build(self, settings: &AlgorithmSettings, ranks: usize) -> Result<Algorithm> {
        if !settings.compress.is_none() && self != AlgorithmName::DiLoCo {
            return Err(Error::value(
                "'compress' applies to algorithm 'diloco' only",
            ));
        }
        let (period, warmup) = (settings.period, settings.warmup);
        Ok(match self {
            AlgorithmName::Sync => Algorithm::SyncSgd,
            AlgorithmName::Zero => Algorithm::Zero,
            AlgorithmName::Periodic => Algorithm::PostLocalPeriodic { period, warmup },
            AlgorithmName::Hierarchical => Algorithm::PostLocalHierarchical {
                levels: settings
                    .levels
                    .clone()
                    .unwrap_or_else(|| Algorithm::default_hierarchy(period, ranks)),
                warmup,
                subgroup_size: settings.subgroup_size,
            },
            AlgorithmName::DiLoCo => Algorithm::DiLoCo {
                sync_every: period,
                fragments: settings.fragments,
                compress: settings.compress,
                fragment_sync_delay: settings.fragment_sync_delay,
                fragment_update_alpha: settings.fragment_update_alpha,
            },
        })
    }
}

impl FromStr for AlgorithmName {
    type Err = Error;

    /// `sync`, `periodic`, `hierarchical`, `zero` or `diloco` (also `sync_sgd`,
    /// `post_local_periodic` and `post_local_hierarchical`, the settings' kinds).
    fn from_str(name: &str) -> Result<AlgorithmName> {
        Ok(match name {
            "sync" | "sync_sgd" => AlgorithmName::Sync,
            "periodic" | "post_local_periodic" => AlgorithmName::Periodic,
            "hierarchical" | "post_local_hierarchical" => AlgorithmName::Hierarchical,
            "zero" => AlgorithmName::Zero,
            "diloco" => AlgorithmName::DiLoCo,
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(Error::value(format!(
                    "unknown algorithm '{shown}': expected sync, periodic, hierarchical, zero or diloco"
                )));
            }
        })
    }
}

/// The settings of the trainer's algorithms, with the defaults every front end shares.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AlgorithmSettings {
    /// The averaging period (post-local SGD) or DiLoCo's sync interval (default 8).
    pub period: u64,
    /// Steps of synchronous SGD before post-local SGD starts (default [`DEFAULT_WARMUP`]).
    pub warmup: u64,
    /// DiLoCo's fragments (default 1: plain DiLoCo).
    pub fragments: usize,
    /// DiLoCo's pseudo-gradients on the wire (default: uncompressed).
    pub compress: Compression,
    /// DiLoCo's `fragment_sync_delay` (torchft's; default 0).
    pub fragment_sync_delay: u64,
    /// DiLoCo's `fragment_update_alpha` (torchft's; default `None`: no mix, see
    /// [`DiLoCoOptions::fragment_update_alpha`](crate::diloco::DiLoCoOptions::fragment_update_alpha)).
    pub fragment_update_alpha: Option<f64>,
    /// Hierarchical averaging's `(period, group size)` levels (default:
    /// [`Algorithm::default_hierarchy`]).
    pub levels: Option<Vec<(u64, usize)>>,
    /// Hierarchical post-local SGD's gradient all-reduce group after warm-up (default none).
    pub subgroup_size: Option<usize>,
}

/// The default warm-up of post-local SGD: steps of synchronous SGD first, as PyTorch's
/// `start_localSGD_iter` asks for (local SGD from a random start diverges).
pub const DEFAULT_WARMUP: u64 = 20;

impl Default for AlgorithmSettings {
    fn default() -> Self {
        AlgorithmSettings {
            period: 8,
            warmup: DEFAULT_WARMUP,
            fragments: 1,
            compress: Compression::None,
            fragment_sync_delay: 0,
            fragment_update_alpha: None,
            levels: None,
            subgroup_size: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_value_errors() {
        for name in AlgorithmName::ALL {
            assert_eq!(name.name().parse::<AlgorithmName>().unwrap(), name);
        }
        let e = "ddp".parse::<AlgorithmName>().unwrap_err();
        assert_eq!(e.kind().name(), "ValueError");
        assert!(e.message().contains("unknown algorithm 'ddp'"));
    }

    #[test]
    fn settings_build_each_algorithm_and_refuse_what_does_not_apply() {
        let settings = AlgorithmSettings::default();
        assert_eq!(
            AlgorithmName::Periodic.build(&settings, 4).unwrap(),
            Algorithm::PostLocalPeriodic {
                period: 8,
                warmup: DEFAULT_WARMUP
            }
        );
        assert_eq!(
            AlgorithmName::Hierarchical.build(&settings, 4).unwrap(),
            Algorithm::PostLocalHierarchical {
                levels: Algorithm::default_hierarchy(8, 4),
                warmup: DEFAULT_WARMUP,
                subgroup_size: None
            }
        );
        let compressed = AlgorithmSettings {
            compress: Compression::BFloat16,
            ..AlgorithmSettings::default()
        };
        assert!(AlgorithmName::DiLoCo.build(&compressed, 4).is_ok());
        let e = AlgorithmName::Sync.build(&compressed, 4).unwrap_err();
        assert!(
            e.message()
                .contains("'compress' applies to algorithm 'diloco' only")
        );
    }
}
