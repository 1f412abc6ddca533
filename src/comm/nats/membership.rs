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
//!
//! Both statements are sealed (`seal.rs`): an arrival holds its rank's seal of "rank R arrived
//! at sync point K of run N", and the live ranks are followed by their proposer's rank and seal.
//! An arrival that is not its rank's own does not count (and is counted as forged); a
//! membership that no rank of the previous one sealed fails every rank with a named error — a
//! client of the run cannot make the ranks average over fewer of them than arrived.

use std::time::Duration;

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::inbox::Inbox;
use super::seal::{Keys, Signer};
use crate::comm::wire::SEAL_BYTES;
use crate::error::{Error, Result};

/// How often the bucket is read while a sync point is open.
const POLL: Duration = Duration::from_millis(20);

fn arrived_key(k: u64, rank: usize) -> String {
    format!("sync.{k}.at.{rank}")
}

fn live_key(k: u64) -> String {
    format!("sync.{k}.live")
}

fn ranks_text(live: &[bool]) -> String {
    let ranks: Vec<String> = live
        .iter()
        .enumerate()
        .filter(|&(_, &l)| l)
        .map(|(r, _)| r.to_string())
        .collect();
    ranks.join(",")
}

/// What rank `rank`'s arrival at sync point `k` of run `run` seals.
fn arrival_statement(run: &str, k: u64, rank: usize) -> Vec<u8> {
    format!("distopt run {run}: rank {rank} arrived at sync point {k}").into_bytes()
}

/// What the proposer of sync point `k`'s live ranks `ranks` seals.
fn live_statement(run: &str, k: u64, ranks: &str) -> Vec<u8> {
    format!("distopt run {run}: the live ranks of sync point {k} are {ranks}").into_bytes()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    text.len()
        .is_multiple_of(2)
        .then(|| {
            (0..text.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

/// `sync.K.live`'s value: the live ranks, the proposer's rank and its seal.
fn encode(live: &[bool], proposer: usize, seal: &[u8; SEAL_BYTES]) -> Bytes {
    Bytes::from(format!("{} {proposer} {}", ranks_text(live), hex(seal)))
}

/// The live ranks, the proposer and its seal, and the ranks as the proposer wrote them.
fn decode(bytes: &[u8], ranks: usize) -> Option<(Vec<bool>, usize, Vec<u8>, String)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split(' ');
    let (list, proposer, seal) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() {
        return None;
    }
    let mut live = vec![false; ranks];
    for item in list.split(',') {
        let rank: usize = item.parse().ok()?;
        *live.get_mut(rank)? = true;
    }
    let proposer: usize = proposer.parse().ok()?;
    (live.contains(&true) && proposer < ranks).then_some(())?;
    Some((live, proposer, unhex(seal)?, list.to_string()))
}

/// What the agreement needs of its process.
pub(super) struct Point<'a> {
    pub store: &'a kv::Store,
    pub inbox: &'a Inbox,
    pub signer: &'a Signer,
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
        let keys: std::sync::Arc<Keys> = self.inbox.keys().ok_or_else(|| {
            Error::runtime(format!(
                "run '{}' rank {}: sync point {k} before the run's keys are known",
                self.run, self.rank
            ))
        })?;
        let arrival = self
            .signer
            .seal_statement(&arrival_statement(self.run, k, self.rank));
        self.store
            .put(arrived_key(k, self.rank), Bytes::copy_from_slice(&arrival))
            .await
            .map_err(|e| self.failed(k, "cannot say it arrived", &e))?;
        let live = loop {
            let agreed = self
                .store
                .get(live_key(k))
                .await
                .map_err(|e| self.failed(k, "cannot read the membership", &e))?;
            if let Some(bytes) = agreed {
                let (live, proposer, seal, list) = decode(&bytes, ranks).ok_or_else(|| {
                    Error::runtime(format!(
                        "run '{}' rank {}: sync point {k}: the agreed membership '{}' is not a list of ranks of a run of {ranks}, its proposer and its seal",
                        self.run,
                        self.rank,
                        String::from_utf8_lossy(&bytes)
                    ))
                })?;
                if !previous[proposer]
                    || !keys.sealed_statement(proposer, &live_statement(self.run, k, &list), &seal)
                {
                    self.inbox.note_forged();
                    return Err(Error::runtime(format!(
                        "run '{}' rank {}: sync point {k}: the agreed membership ({list}) is forged: rank {proposer}, whose proposal it claims to be, did not seal it",
                        self.run, self.rank
                    )));
                }
                break live;
            }
            // Another client may have overwritten this rank's arrival: say it again.
            let own = self
                .store
                .get(arrived_key(k, self.rank))
                .await
                .map_err(|e| self.failed(k, "cannot read its arrival", &e))?;
            if own.as_deref() != Some(&arrival[..]) {
                self.store
                    .put(arrived_key(k, self.rank), Bytes::copy_from_slice(&arrival))
                    .await
                    .map_err(|e| self.failed(k, "cannot say it arrived", &e))?;
            }
            let mut arrived = vec![false; ranks];
            let mut open = false;
            for rank in (0..ranks).filter(|&r| previous[r]) {
                arrived[rank] = rank == self.rank || {
                    let said = self
                        .store
                        .get(arrived_key(k, rank))
                        .await
                        .map_err(|e| self.failed(k, "cannot read the arrivals", &e))?;
                    let statement = arrival_statement(self.run, k, rank);
                    match said {
                        Some(seal) if keys.sealed_statement(rank, &statement, &seal) => true,
                        Some(_) => {
                            // Another client's word for this rank: the rank has not arrived.
                            self.inbox.note_forged();
                            false
                        }
                        None => false,
                    }
                };
                open |= !arrived[rank] && self.inbox.silent_for(rank) <= self.bound;
            }
            if !open {
                // Every rank of the last membership arrived or is gone: propose. Of several
                // proposals the server keeps the first; the others read it above.
                let seal =
                    self.signer
                        .seal_statement(&live_statement(self.run, k, &ranks_text(&arrived)));
                if self
                    .store
                    .create(live_key(k), encode(&arrived, self.rank, &seal))
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
