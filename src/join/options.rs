//! `Join`'s options (`enable`, `throw_on_early_termination`, and DDP's
//! `divide_by_initial_world_size`).

/// `Join(joinables, enable, throw_on_early_termination, **kwargs)`'s options, with the one
/// keyword argument a distopt joinable reads.
/// Build them with `JoinOptions::default().with_…(..)` (the struct may gain fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct JoinOptions {
    /// Uneven-input detection on (`True` by default). Off, the context does nothing, and the
    /// ranks must have even inputs.
    pub enable: bool,
    /// Raise on every rank as soon as one rank runs out of inputs (`False` by default).
    pub throw_on_early_termination: bool,
    /// DDP's join hook keyword: divide the gradient sum by the initial world size even when
    /// some ranks have joined (`True` by default); otherwise by the number of active ranks.
    pub divide_by_initial_world_size: bool,
}

impl JoinOptions {
    /// With `enable` set to `on`.
    pub fn with_enable(mut self, on: bool) -> Self {
        self.enable = on;
        self
    }

    /// With `throw_on_early_termination` set to `on`.
    pub fn with_throw_on_early_termination(mut self, on: bool) -> Self {
        self.throw_on_early_termination = on;
        self
    }

    /// With `divide_by_initial_world_size` set to `on`.
    pub fn with_divide_by_initial_world_size(mut self, on: bool) -> Self {
        self.divide_by_initial_world_size = on;
        self
    }
}

impl Default for JoinOptions {
    fn default() -> Self {
        JoinOptions {
            enable: true,
            throw_on_early_termination: false,
            divide_by_initial_world_size: true,
        }
    }
}
