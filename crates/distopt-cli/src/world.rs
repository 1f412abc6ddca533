//! `--world nats://HOST:PORT --run NAME --ranks R`: this process as one rank of a NATS run.

use std::sync::Arc;

use distopt::Error;
use distopt::comm::Communicator;

use crate::args::WorldArgs;

/// Joins the run `args` names, of `ranks` processes.
///
/// # Errors
/// A `ValueError` when `--run` or `--ranks` is missing (or the build has no `nats` feature);
/// those of `NatsWorld::join`.
pub fn join(args: &WorldArgs, ranks: Option<usize>) -> Result<Arc<dyn Communicator>, Error> {
    Ok(join_nats(args, ranks)?)
}

/// The NATS world itself (for `bench comm`, which also needs its raw peer).
#[cfg(feature = "nats")]
pub fn join_nats(
    args: &WorldArgs,
    ranks: Option<usize>,
) -> Result<Arc<distopt::comm::NatsWorld>, Error> {
    use distopt::comm::{NatsOptions, NatsWorld};
    let url = args.world.clone().unwrap_or_default();
    let run = args
        .run
        .clone()
        .ok_or_else(|| Error::value("--world needs --run NAME: the run's name"))?;
    let ranks =
        ranks.ok_or_else(|| Error::value("--world needs --ranks R: the processes of the run"))?;
    let mut options = NatsOptions::new(url, run, ranks);
    options.rank = args.rank;
    options.token = args
        .token
        .clone()
        .or_else(|| std::env::var("DISTOPT_NATS_TOKEN").ok());
    NatsWorld::join(&options)
}

/// Without the `nats` feature, `--world` is an error that says how to build it.
#[cfg(not(feature = "nats"))]
pub fn join_nats(_args: &WorldArgs, _ranks: Option<usize>) -> Result<Arc<dyn Communicator>, Error> {
    Err(Error::value(
        "--world needs the `nats` feature: cargo build --release -p distopt-cli --features nats",
    ))
}
