//! Seals [`super::OptimizerMath`] and [`super::GroupOptions`]: an optimizer's math and options
//! are implemented inside the crate, next to their kernels (see ARCHITECTURE.md, "How to add
//! an optimizer"); [`super::LocalOptimizer`] stays open. Each implementation names it beside
//! its type.

/// Implemented by the crate's optimizer algorithms and options only.
pub trait Sealed {}
