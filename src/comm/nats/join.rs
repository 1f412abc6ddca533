//! Joining a run: the rendezvous of a [`NatsWorld`](super::NatsWorld)'s processes, through a
//! JetStream key-value bucket of the server (no broker of distopt's own).
//!
//! A run `NAME` of R ranks is the bucket `distopt_NAME`, in memory. A process subscribes to its
//! own subject first, then claims a rank by creating the key `rank.K` with its token and its public key (the
//! server's atomic create: of two processes claiming one rank, exactly one wins), the lowest
//! free rank unless it asks for one; then it waits until all R keys exist and reads every
//! rank's token, which names that rank's subject. Because each process subscribes before it
//! claims, no rank can publish to another before that one listens. A process that leaves cleanly
//! deletes its key, so the name can be used again.

use std::time::Duration;

use web_time::Instant;

use bytes::Bytes;

use super::link::{Bucket, Link};

use crate::error::{Error, Result};

/// Checks that `run` can name a run: 1 to 64 letters, digits, `-` and `_` (a NATS subject
/// token and a bucket name both).
///
/// # Errors
/// A `ValueError` naming the run otherwise.
pub(super) fn check_run_name(run: &str) -> Result<()> {
    if run.is_empty()
        || run.len() > 64
        || !run
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(Error::value(format!(
            "a run's name holds 1 to 64 letters, digits, '-' and '_', got '{run}'"
        )));
    }
    Ok(())
}

/// The bucket of run `run`.
pub(super) fn bucket_name(run: &str) -> String {
    format!("distopt_{run}")
}

/// The key of rank `rank`.
pub(super) fn rank_key(rank: usize) -> String {
    format!("rank.{rank}")
}

/// The key of a process's request to join a running run as rank `rank`.
pub(super) fn join_key(rank: usize) -> String {
    format!("join.{rank}")
}

/// What a process asking to join run `run` as rank `rank` seals with the key of its claim.
pub(super) fn join_statement(run: &str, rank: usize) -> Vec<u8> {
    format!("distopt run {run}: a process asks to join as rank {rank}").into_bytes()
}

/// Opens run `run`'s bucket, which must exist: the run is running.
///
/// # Errors
/// A `RuntimeError` when the run has no bucket (it has not started, or it is over).
pub(super) async fn running_bucket(link: &dyn Link, run: &str) -> Result<Box<dyn Bucket>> {
    link.bucket(&bucket_name(run), false).await.map_err(|e| {
        Error::runtime(format!(
            "run '{run}' is not running (its key-value bucket {} cannot be opened: {e}): start it without --join",
            bucket_name(run)
        ))
    })
}

/// Rank `rank`'s claim as the bucket holds it now.
///
/// # Errors
/// A `RuntimeError` when the bucket cannot be read, or the claim is missing or malformed.
pub(super) async fn read_claim(bucket: &dyn Bucket, run: &str, rank: usize) -> Result<Claim> {
    match bucket.get(&rank_key(rank)).await {
        Ok(Some(value)) => Claim::decode(run, rank, &value),
        Ok(None) => Err(Error::runtime(format!(
            "run '{run}': rank {rank} has no claim"
        ))),
        Err(e) => Err(Error::runtime(format!(
            "run '{run}': cannot read rank {rank}'s claim: {e}"
        ))),
    }
}

/// Takes rank `rank` of a running run, one that left it: its claim becomes `claim`.
///
/// # Errors
/// A `RuntimeError` when the bucket cannot be written.
pub(super) async fn take_over(
    bucket: &dyn Bucket,
    run: &str,
    rank: usize,
    claim: &Claim,
) -> Result<()> {
    bucket
        .put(&rank_key(rank), Bytes::from(claim.encode()))
        .await
        .map_err(|e| Error::runtime(format!("run '{run}': cannot claim rank {rank}: {e}")))
}

/// Opens (or creates) run `run`'s bucket.
pub(super) async fn open_bucket(link: &dyn Link, run: &str) -> Result<Box<dyn Bucket>> {
    let bucket = bucket_name(run);
    link.bucket(&bucket, true).await.map_err(|e| {
        Error::runtime(format!(
            "run '{run}': cannot open the key-value bucket {bucket} (is JetStream enabled on the server? start it with -js): {e}"
        ))
    })
}

/// A rank's claim: the process's token (which names its subject) and its public key (which
/// checks its frames' seals, `seal.rs`), as the key `rank.K` holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    /// The token naming the rank's subject.
    pub token: String,
    /// The rank's public NKey.
    pub key: String,
}

impl Claim {
    fn encode(&self) -> String {
        format!("{} {}", self.token, self.key)
    }

    fn decode(run: &str, rank: usize, value: &[u8]) -> Result<Claim> {
        let text = String::from_utf8_lossy(value);
        match text.split_once(' ') {
            Some((token, key)) if !token.is_empty() && !key.is_empty() && !key.contains(' ') => {
                Ok(Claim {
                    token: token.to_string(),
                    key: key.to_string(),
                })
            }
            _ => Err(Error::runtime(format!(
                "run '{run}': rank {rank}'s claim '{text}' is not a token and a key (a client of another version, or not of distopt)"
            ))),
        }
    }
}

/// Claims a rank of `ranks` with `claim`: `requested`, or the lowest free one.
pub(super) async fn claim(
    bucket: &dyn Bucket,
    run: &str,
    ranks: usize,
    requested: Option<usize>,
    claim: &Claim,
) -> Result<usize> {
    let candidates: Vec<usize> = match requested {
        Some(rank) if rank >= ranks => {
            return Err(Error::value(format!(
                "rank {rank} requested in run '{run}' of {ranks} ranks"
            )));
        }
        Some(rank) => vec![rank],
        None => (0..ranks).collect(),
    };
    for rank in candidates {
        if bucket
            .create(&rank_key(rank), Bytes::from(claim.encode()))
            .await
            .is_ok()
        {
            return Ok(rank);
        }
    }
    Err(Error::runtime(match requested {
        Some(rank) => format!("run '{run}': rank {rank} is taken by another process"),
        None => format!("run '{run}' already has its {ranks} ranks"),
    }))
}

/// Every rank's claim, once all `ranks` are claimed, waiting at most `timeout`. This process
/// holds rank `mine` with claim `own`.
///
/// # Errors
/// A `RuntimeError` when the run is not complete within `timeout`, a rank left before this
/// process saw it, a claim is malformed, or this process's own claim holds another value (a
/// client of the run overwrote it, to have its key taken for this rank's).
pub(super) async fn claims(
    bucket: &dyn Bucket,
    run: &str,
    ranks: usize,
    timeout: Duration,
    (mine, own): (usize, &Claim),
) -> Result<Vec<Claim>> {
    let deadline = Instant::now() + timeout;
    let mut tokens: Vec<Option<Claim>> = vec![None; ranks];
    loop {
        for (rank, slot) in tokens.iter_mut().enumerate() {
            if slot.is_none()
                && let Ok(Some(entry)) = bucket.entry(&rank_key(rank)).await
            {
                if entry.deleted {
                    // The rank joined and has left already: the run started without this
                    // process seeing it, and cannot go on.
                    return Err(Error::runtime(format!(
                        "run '{run}': rank {rank} joined and left before this process saw it"
                    )));
                }
                let claim = Claim::decode(run, rank, &entry.value)?;
                if rank == mine && claim != *own {
                    return Err(Error::runtime(format!(
                        "run '{run}': this process's claim of rank {rank} was overwritten by another client (it now names key {})",
                        claim.key
                    )));
                }
                *slot = Some(claim);
            }
        }
        let joined = tokens.iter().filter(|t| t.is_some()).count();
        if joined == ranks {
            return Ok(tokens.into_iter().flatten().collect());
        }
        if Instant::now() > deadline {
            return Err(Error::runtime(format!(
                "run '{run}': {joined} of {ranks} ranks joined within {:.0} s",
                timeout.as_secs_f64()
            )));
        }
        bucket.pause(Duration::from_millis(20)).await;
    }
}
