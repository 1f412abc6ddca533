//! The membership of a sync point, agreed through the run's key-value bucket (the elastic half
//! of [`Communicator::membership`](crate::comm::Communicator::membership) over NATS).
//!
//! At sync point `k` every live process puts `sync.K.at.RANK`, then watches the bucket until
//! `sync.K.live` exists. A process that sees every rank of the previous membership either
//! arrived or silent for the failure bound (gone) creates `sync.K.live` with the ranks that
//! arrived; the server's atomic create makes exactly one proposal win, and every process takes
//! the membership from that key, so all agree. A process not in it (it arrived after the run
//! went on without it) fails with a named error. Keys two sync points old are deleted, so a
//! long run keeps a bounded bucket.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::inbox::Inbox;
use crate::error::{Error, Result};

/// How often the bucket is read while a sync point is open.
const POLL: Duration = Duration::from_millis(20);

fn arrived_key(k: u64, rank: usize) -> String {
    format!("sync.{k}.at.{rank}")
}

fn live_key(k: u64) -> String {
    format!("sync.{k}.live")
}

fn encode(live: &[bool]) -> Bytes {
    let ranks: Vec<String> = live
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l)
        .map(|(r, _)| r.to_string())
        .collect();
    Bytes::from(ranks.join(","))
}

fn decode(bytes: &[u8], ranks: usize) -> Option<Vec<bool>> {
    let mut live = vec![false; ranks];
    for item in std::str::from_utf8(bytes).ok()?.split(',') {
        let rank: usize = item.parse().ok()?;
        *live.get_mut(rank)? = true;
    }
    live.contains(&true).then_some(live)
}

/// What the agreement needs of its process.
pub(super) struct Point<'a> {
    pub store: &'a kv::Store,
    pub inbox: &'a Inbox,
    pub run: &'a str,
    pub rank: usize,
    pub bound: Duration,
}

impl Point<'_> {
    fn failed(&self, k: u64, what: &str, e: &dyn std::fmt::Display) -> Error {
        Error::runtime(format!(
            "run '{}' rank {}: sync point {k}: {what}: {e}",
            self.run, self.rank
        ))
    }

    /// The live ranks of sync point `k`, `previous` being sync point `k - 1`'s.
    ///
    /// # Errors
    /// A `RuntimeError` when the bucket cannot be read or written, the agreed membership is
    /// malformed, or it does not hold this rank.
    pub(super) async fn agree(&self, k: u64, previous: &[bool]) -> Result<Vec<bool>> {
        let ranks = previous.len();
        self.store
            .put(arrived_key(k, self.rank), Bytes::new())
            .await
            .map_err(|e| self.failed(k, "cannot say it arrived", &e))?;
        let live = loop {
            let agreed = self
                .store
                .get(live_key(k))
                .await
                .map_err(|e| self.failed(k, "cannot read the membership", &e))?;
            if let Some(bytes) = agreed {
                break decode(&bytes, ranks).ok_or_else(|| {
                    Error::runtime(format!(
                        "run '{}' rank {}: sync point {k}: the agreed membership '{}' is not a list of ranks of a run of {ranks}",
                        self.run,
                        self.rank,
                        String::from_utf8_lossy(&bytes)
                    ))
                })?;
            }
            let mut arrived = vec![false; ranks];
            let mut open = false;
            for rank in (0..ranks).filter(|&r| previous[r]) {
                arrived[rank] = rank == self.rank
                    || self
                        .store
                        .get(arrived_key(k, rank))
                        .await
                        .map_err(|e| self.failed(k, "cannot read the arrivals", &e))?
                        .is_some();
                open |= !arrived[rank] && self.inbox.silent_for(rank) <= self.bound;
            }
            if !open {
                // Every rank of the last membership arrived or is gone: propose. Of several
                // proposals the server keeps the first; the others read it above.
                if self
                    .store
                    .create(live_key(k), encode(&arrived))
                    .await
                    .is_ok()
                {
                    break arrived;
                }
                continue;
            }
            tokio::time::sleep(POLL).await;
        };
        if !live[self.rank] {
            return Err(Error::runtime(format!(
                "run '{}' rank {}: sync point {k} went on without this rank (it arrived after the others had given up on it)",
                self.run, self.rank
            )));
        }
        if k >= 2 {
            let _ = self.store.delete(arrived_key(k - 2, self.rank)).await;
            if live.iter().position(|&l| l) == Some(self.rank) {
                let _ = self.store.delete(live_key(k - 2)).await;
            }
        }
        Ok(live)
    }
}
