//! A small data-parallel training run, driven step by step through the library's real
//! machinery: the front-end-independent core of `distopt train` and of the browser demo.
//!
//! A [`Task`] is a classification problem split into one shard per rank, each shard skewed
//! towards a few classes so that ranks which train alone drift apart ([`task`]): a
//! [`SyntheticTask`] (Gaussian clusters, a few per class) or a [`DatasetTask`] over real data
//! given by the caller — such as the UCI hand-written digits the library embeds
//! ([`Dataset::digits`]) — with a held-out test split that [`Trainer::evaluate`] measures.
//! [`TaskKind`] names the built-in ones (`"digits".parse()`). The model is a two-layer
//! perceptron (`features → hidden (tanh) → classes`, softmax cross-entropy) with hand-written
//! backprop (`model.rs`).
//!
//! Folders: `task/` (the data and its split: one file per task, the shards, the names),
//! `model.rs` (the perceptron), `trainer.rs` (the algorithms and the step loop).
//!
//! A [`Trainer`] keeps R replicas of the model in [`Replicas`](crate::replicas::Replicas) on a backend. Each
//! [`Trainer::step`] reads the parameters back, computes every rank's mini-batch gradient on
//! the host, writes the gradients with [`Replicas::set_grads`](crate::replicas::Replicas::set_grads), synchronizes them with the
//! post-local-SGD hook ([`PostLocalSgdState`](crate::post_local_sgd::PostLocalSgdState)) and runs the local [`Sgd`](crate::optim::Sgd) step — plain, for
//! synchronous SGD, or wrapped in a [`PostLocalSgdOptimizer`](crate::post_local_sgd::PostLocalSgdOptimizer) with a periodic or hierarchical
//! model averager, or as the inner optimizer of a [`DiLoCo`](crate::diloco::DiLoCo) (plain or streaming).
//! Communication goes through a [`Communicator`](crate::comm::Communicator): a [`SimulatedWorld`](crate::comm::SimulatedWorld) holding
//! every rank ([`Trainer::new`]), or one rank per process over MPI ([`Trainer::with_world`]),
//! where each process trains its own shard and the reports (losses, divergence, evaluation)
//! are gathered so that every process sees the whole world's.
//!
//! Nothing here blocks or reads a clock: the core is `async` (on wasm32 a step awaits the
//! device's readback); native callers wait with `.block_on()` ([`crate::BlockOn`]).
//!
//! ```
//! use distopt::BlockOn;
//! use std::sync::Arc;
//! use distopt::CpuBackend;
//! use distopt::train::{Algorithm, SyntheticTask, TaskConfig, TrainConfig, Trainer};
//! let task = Arc::new(SyntheticTask::new(TaskConfig { samples: 512, ..TaskConfig::default() }, 4).unwrap());
//! let config = TrainConfig { algorithm: Algorithm::SyncSgd, ..TrainConfig::default() };
//! let mut trainer = Trainer::new(Arc::new(CpuBackend::new()), task, config).unwrap();
//! let first = trainer.step().block_on().unwrap();
//! assert_eq!(first.step, 1);
//! assert_eq!(first.divergence, 0.0); // synchronous SGD keeps the replicas identical
//! assert!(first.bytes_communicated_per_rank > 0);
//!
//! // The digits, non-IID over 4 ranks, evaluated on the 359 held-out images.
//! let digits = Arc::new(distopt::train::DatasetTask::digits(4).unwrap());
//! let config = TrainConfig { algorithm: Algorithm::Zero, ..TrainConfig::default() };
//! let mut trainer = Trainer::new(Arc::new(CpuBackend::new()), digits, config).unwrap();
//! trainer.step().block_on().unwrap();
//! let evaluation = trainer.evaluate().block_on().unwrap();
//! assert!(evaluation.held_out && evaluation.samples == 359);
//! ```

mod algorithm;
mod model;
pub mod task;
mod trainer;

pub use algorithm::{AlgorithmName, AlgorithmSettings, DEFAULT_WARMUP};
pub use task::{
    DIGITS_BIN, Dataset, DatasetConfig, DatasetTask, SyntheticTask, Task, TaskConfig, TaskKind,
};
pub use trainer::{Algorithm, DILOCO_OUTER, Evaluation, StepReport, TrainConfig, Trainer};
