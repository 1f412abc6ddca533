//! Joining a run: the rendezvous of a [`NatsWorld`](super::NatsWorld)'s processes, through a
//! JetStream key-value bucket of the server (no broker of distopt's own).
//!
//! A run `NAME` of R ranks is the bucket `distopt_NAME`, in memory. A process subscribes to its
//! own subject first, then claims a rank by creating the key `rank.K` with its token (the
//! server's atomic create: of two processes claiming one rank, exactly one wins), the lowest
//! free rank unless it asks for one; then it waits until all R keys exist and reads every
//! rank's token, which names that rank's subject. Because each process subscribes before it
//! claims, no rank can publish to another before that one listens. A process that leaves cleanly
//! deletes its key, so the name can be used again.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use bytes::Bytes;

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

/// Opens (or creates) run `run`'s bucket.
pub(super) async fn open_bucket(js: &jetstream::Context, run: &str) -> Result<kv::Store> {
    let bucket = bucket_name(run);
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    match js
        .create_key_value(kv::Config {
            bucket: bucket.clone(),
            history: 1,
            storage: jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
    {
        Ok(store) => Ok(store),
        // Another process created it meanwhile.
        Err(first) => js.get_key_value(&bucket).await.map_err(|_| {
            Error::runtime(format!(
                "run '{run}': cannot open the key-value bucket {bucket} (is JetStream enabled on the server? start it with -js): {first}"
            ))
        }),
    }
}

/// Claims a rank of `ranks` for `token`: `requested`, or the lowest free one.
pub(super) async fn claim(
    store: &kv::Store,
    run: &str,
    ranks: usize,
    requested: Option<usize>,
    token: &str,
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
        if store
            .create(rank_key(rank), Bytes::from(token.to_string()))
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

/// Every rank's token, once all `ranks` are claimed, waiting at most `timeout`.
pub(super) async fn tokens(
    store: &kv::Store,
    run: &str,
    ranks: usize,
    timeout: Duration,
) -> Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    let mut tokens: Vec<Option<String>> = vec![None; ranks];
    loop {
        for (rank, slot) in tokens.iter_mut().enumerate() {
            if slot.is_none()
                && let Ok(Some(entry)) = store.entry(rank_key(rank)).await
            {
                if entry.operation != kv::Operation::Put {
                    // The rank joined and has left already: the run started without this
                    // process seeing it, and cannot go on.
                    return Err(Error::runtime(format!(
                        "run '{run}': rank {rank} joined and left before this process saw it"
                    )));
                }
                *slot = Some(String::from_utf8_lossy(&entry.value).into_owned());
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
