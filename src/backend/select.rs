//! Choosing a backend: the GPU where a hardware adapter exists, else the CPU.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::gpu::GpuBackend;
use super::interface::Backend;
use crate::error::{Error, Result};

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// A real GPU when there is one; the CPU backend when the only adapter is a software one
    /// (on the same cores the native loop is faster) or none exists.
    Auto,
    /// The GPU backend, on whatever adapter wgpu finds (software adapters included).
    Gpu,
    /// The plain-Rust backend.
    Cpu,
}

impl BackendChoice {
    /// Parses `auto`, `gpu` or `cpu`.
    ///
    /// # Errors
    /// A `ValueError` naming the accepted names for any other (case-sensitive) name.
    pub fn parse(name: &str) -> Result<BackendChoice> {
        match name {
            "auto" => Ok(BackendChoice::Auto),
            "gpu" => Ok(BackendChoice::Gpu),
            "cpu" => Ok(BackendChoice::Cpu),
            other => Err(Error::value(format!(
                "unknown backend '{other}': expected auto, gpu or cpu"
            ))),
        }
    }
}

impl std::str::FromStr for BackendChoice {
    type Err = crate::error::Error;

    /// As [`BackendChoice::parse`].
    fn from_str(name: &str) -> crate::error::Result<BackendChoice> {
        BackendChoice::parse(name)
    }
}

/// The backend picked by [`select_backend`] and why.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The backend to run on.
    pub backend: Arc<dyn Backend>,
    /// One sentence on why it was chosen.
    pub reason: String,
}

/// Picks a backend. `Gpu` fails with a `RuntimeError` when no adapter exists.
///
/// # Errors
/// For [`BackendChoice::Gpu`] only, those of [`GpuBackend::new`] (a `RuntimeError`: no adapter, a
/// device that cannot be opened). `Auto` falls back to the CPU backend instead, and `Cpu` never
/// fails.
pub async fn select_backend(choice: BackendChoice) -> Result<Selection> {
    match choice {
        BackendChoice::Cpu => Ok(Selection {
            backend: Arc::new(CpuBackend::new()),
            reason: "the CPU backend was requested".into(),
        }),
        BackendChoice::Gpu => {
            let gpu = GpuBackend::new().await?;
            let reason = format!("the GPU backend was requested: {}", gpu.info().name);
            Ok(Selection {
                backend: Arc::new(gpu),
                reason,
            })
        }
        BackendChoice::Auto => match GpuBackend::new().await {
            Ok(gpu) if gpu.info().device_type != "Cpu" => {
                let reason = format!(
                    "found a hardware adapter: {} ({})",
                    gpu.info().name,
                    gpu.info().device_type
                );
                Ok(Selection {
                    backend: Arc::new(gpu),
                    reason,
                })
            }
            Ok(gpu) => Ok(Selection {
                backend: Arc::new(CpuBackend::new()),
                reason: format!(
                    "the only adapter, {}, is a software rasterizer on the host's cores: the native CPU backend is faster there",
                    gpu.info().name
                ),
            }),
            Err(err) => Ok(Selection {
                backend: Arc::new(CpuBackend::new()),
                reason: format!("no GPU adapter: {}", err.message()),
            }),
        },
    }
}
