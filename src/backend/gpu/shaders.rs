//! The WGSL sources, embedded at compile time. Each kernel file is prefixed with the shared
//! `packing.wgsl` (storage formats, rounding, the dispatch grid).

/// Storage formats, exact rounding and the 2-D dispatch grid, shared by every kernel.
pub const PACKING: &str = include_str!("../../../shaders/packing.wgsl");

/// The synchronous data-parallel SGD step (`shaders/dp_sgd_step.wgsl`), ready to compile.
pub const DP_SGD_STEP: &str = concat!(
    include_str!("../../../shaders/packing.wgsl"),
    "\n",
    include_str!("../../../shaders/dp_sgd_step.wgsl")
);

/// Every complete shader source with its name, for validation.
pub const ALL: &[(&str, &str)] = &[("dp_sgd_step", DP_SGD_STEP)];
