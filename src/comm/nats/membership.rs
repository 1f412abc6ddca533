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
//! **Joining a running run.** A process that joins (`NatsOptions::join`) takes over the claim
//! of a rank that left (one outside the last membership) with its own token and key, and puts
//! `join.RANK`, its seal of "a process asks to join as rank RANK". The proposer of the next sync
//! point lists such ranks, their request sealed by the key their claim now holds, as *joining*
//! after the live ranks: they take no part in that point, are healed at its end from the lowest
//! live rank, and are expected at the next one. Every process reads the joining ranks' claims
//! anew (their subjects and keys).
//!
//! Both statements are sealed (`seal.rs`): an arrival holds its rank's seal of "rank R arrived
//! at sync point K of run N", and the live ranks are followed by their proposer's rank and seal.
//! An arrival that is not its rank's own does not count (and is counted as forged); a
//! membership that no rank of the previous one sealed fails every rank with a named error — a
//! client of the run cannot make the ranks average over fewer of them than arrived.

use std::time::Duration;

use bytes::Bytes;

use super::inbox::Inbox;
use super::join::{join_key, join_statement, read_claim};
use super::link::{Bucket, LinkError, Watch, Watched};
use super::seal::{Keys, Signer};
use crate::comm::wire::SEAL_BYTES;
use crate::error::{Error, Result};

/// How often the bucket is read while a sync point is open.
const POLL: Duration = Duration::from_millis(20);

fn arrived_key(k: u64, rank: usize) -> String {
    format!("sync.{k}.at.{rank}")
}

/// The key naming the last sync point whose membership was agreed (its proposer puts it).
const LATEST_KEY: &str = "sync.latest";

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

/// What the proposer of sync point `k`'s live ranks `ranks` (and `joining`, `-` for none)
/// seals.
fn live_statement(run: &str, k: u64, ranks: &str, joining: &str) -> Vec<u8> {
    format!("distopt run {run}: the live ranks of sync point {k} are {ranks}, joining {joining}")
        .into_bytes()
}

/// `joining` as the bucket writes it: ranks separated by commas, `-` for none.
fn joining_text(joining: &[usize]) -> String {
    if joining.is_empty() {
        return "-".into();
    }
    let ranks: Vec<String> = joining.iter().map(usize::to_string).collect();
    ranks.join(",")
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

/// `sync.K.live`'s value: the live ranks, the proposer's rank, its seal and the joining ranks.
fn encode(live: &[bool], proposer: usize, seal: &[u8; SEAL_BYTES], joining: &[usize]) -> Bytes {
    Bytes::from(format!(
        "{} {proposer} {} {}",
        ranks_text(live),
        hex(seal),
        joining_text(joining)
    ))
}

/// A decoded `sync.K.live`.
pub(super) struct Agreed {
    /// The live ranks.
    pub live: Vec<bool>,
    /// The ranks that join after this sync point, in rank order (none of them live).
    pub joining: Vec<usize>,
    proposer: usize,
    seal: Vec<u8>,
    /// The live and joining ranks as the proposer wrote them (what it sealed).
    list: String,
    joining_list: String,
}

fn decode(bytes: &[u8], ranks: usize) -> Option<Agreed> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split(' ');
    let (list, proposer, seal) = (fields.next()?, fields.next()?, fields.next()?);
    // Without a fourth field nobody joins (as "-").
    let joining_list = fields.next().unwrap_or("-");
    if fields.next().is_some() {
        return None;
    }
    let mut live = vec![false; ranks];
    for item in list.split(',') {
        let rank: usize = item.parse().ok()?;
        *live.get_mut(rank)? = true;
    }
    let mut joining = Vec::new();
    if joining_list != "-" {
        for item in joining_list.split(',') {
            let rank: usize = item.parse().ok()?;
            (rank < ranks && !live[rank] && joining.last().is_none_or(|&l| l < rank))
                .then_some(())?;
            joining.push(rank);
        }
    }
    let proposer: usize = proposer.parse().ok()?;
    (live.contains(&true) && proposer < ranks).then_some(())?;
    Some(Agreed {
        live,
        joining,
        proposer,
        seal: unhex(seal)?,
        list: list.to_string(),
        joining_list: joining_list.to_string(),
    })
}

/// The last sync point's agreed membership in `bucket` (a run of `ranks` ranks), `None` before
/// the first: the index and the agreement, unchecked (a process that joins has no keys yet).
///
/// # Errors
/// A `RuntimeError` when the bucket cannot be read.
pub(super) async fn latest(
    bucket: &dyn Bucket,
    run: &str,
    ranks: usize,
) -> Result<Option<(u64, Agreed)>> {
    let failed = |e: &dyn std::fmt::Display| {
        Error::runtime(format!(
            "run '{run}': cannot read the run's sync points: {e}"
        ))
    };
    let Some(k) = latest_point(bucket).await.map_err(|e| failed(&e))? else {
        return Ok(None);
    };
    let bytes = bucket.get(&live_key(k)).await.map_err(|e| failed(&e))?;
    Ok(bytes
        .and_then(|bytes| decode(&bytes, ranks))
        .map(|agreed| (k, agreed)))
}

/// The index of the last sync point agreed in `bucket` (`sync.latest`, anyone's word), `None`
/// before the first or when the key holds no index.
async fn latest_point(bucket: &dyn Bucket) -> std::result::Result<Option<u64>, LinkError> {
    let last = bucket.get(LATEST_KEY).await?;
    Ok(last.and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok()))
}

/// Waits until a sync point after `after` admits rank `rank` (lists it as joining): that
/// point's index and agreement, its seal checked against `keys`.
///
/// # Errors
/// A `RuntimeError` when no sync point admits it within `timeout`, the bucket cannot be read,
/// or an agreement is malformed or forged.
pub(super) async fn admission(
    bucket: &dyn Bucket,
    run: &str,
    keys: &Keys,
    (rank, ranks): (usize, usize),
    after: u64,
    timeout: Duration,
) -> Result<(u64, Agreed)> {
    let deadline = web_time::Instant::now() + timeout;
    let mut k = after + 1;
    loop {
        let bytes = bucket
            .get(&live_key(k))
            .await
            .map_err(|e| Error::runtime(format!("run '{run}': cannot read sync point {k}: {e}")))?;
        if let Some(bytes) = bytes {
            let agreed = decode(&bytes, ranks).ok_or_else(|| {
                Error::runtime(format!(
                    "run '{run}': sync point {k}'s membership '{}' is malformed",
                    String::from_utf8_lossy(&bytes)
                ))
            })?;
            let statement = live_statement(run, k, &agreed.list, &agreed.joining_list);
            if !keys.sealed_statement(agreed.proposer, &statement, &agreed.seal) {
                return Err(Error::runtime(format!(
                    "run '{run}': sync point {k}'s membership is forged: rank {} did not seal it",
                    agreed.proposer
                )));
            }
            if agreed.joining.contains(&rank) {
                return Ok((k, agreed));
            }
            k += 1;
            continue;
        }
        // Not there: not yet, or deleted already (the run is two points further): go on from
        // the last one there is.
        if let Some((last, _)) = latest(bucket, run, ranks).await?
            && last > k
        {
            k = last;
            continue;
        }
        if web_time::Instant::now() > deadline {
            return Err(Error::runtime(format!(
                "run '{run}': no sync point took this process in as rank {rank} within {:.0} s (the run reached sync point {})",
                timeout.as_secs_f64(),
                k.saturating_sub(1)
            )));
        }
        bucket.pause(POLL).await;
    }
}

/// This sync point's keys as last read or seen in a watch update (`None`: absent).
type Seen = std::collections::HashMap<String, Option<Bytes>>;

/// Waits until a key under `prefix` changes in the bucket (`watch`'s next update, recorded in
/// `seen`) or [`POLL`] passes; without a watch, or once it ended, for [`POLL`]. Returns whether
/// an update came (else every key must be read again).
async fn bucket_changed(
    bucket: &dyn Bucket,
    watch: &mut Option<&mut Box<dyn Watch>>,
    prefix: &str,
    seen: &mut Seen,
) -> bool {
    let deadline = web_time::Instant::now() + POLL;
    if let Some(w) = watch.as_deref_mut() {
        loop {
            match w.next_before(deadline).await {
                Watched::Quiet => return false,
                Watched::Update(update) if update.key.starts_with(prefix) => {
                    seen.insert(update.key, update.value);
                    // Take every update already there before looking again.
                    while let Some(update) = w.ready() {
                        if update.key.starts_with(prefix) {
                            seen.insert(update.key, update.value);
                        }
                    }
                    return true;
                }
                Watched::Update(_) => {}
                Watched::Ended => break,
            }
        }
        // The watch ended or failed: poll from now on.
        *watch = None;
    }
    bucket
        .pause(deadline.saturating_duration_since(web_time::Instant::now()))
        .await;
    false
}

/// What the agreement needs of its process.
pub(super) struct Point<'a> {
    pub bucket: &'a dyn Bucket,
    pub inbox: &'a Inbox,
    pub signer: &'a Signer,
    pub run: &'a str,
    pub rank: usize,
    pub bound: Duration,
}

impl Point<'_> {
    /// `key`'s value: as `seen` holds it, else read from the bucket (and kept in `seen`).
    async fn read(
        &self,
        seen: &mut Seen,
        key: String,
    ) -> std::result::Result<Option<Bytes>, LinkError> {
        if let Some(value) = seen.get(&key) {
            return Ok(value.clone());
        }
        let value = self.bucket.get(&key).await?;
        seen.insert(key, value.clone());
        Ok(value)
    }

    /// The error of a process that arrived at sync point `k` after the run went on without it.
    fn left_behind(&self, k: u64) -> Error {
        Error::runtime(format!(
            "run '{}' rank {}: sync point {k} went on without this rank (it arrived after the others had given up on it)",
            self.run, self.rank
        ))
    }

    /// Whether the run agreed a later sync point than `k` without this rank: a process that was
    /// suspended (a sleeping tab, a stopped process) arrives at a point whose keys may be
    /// deleted already, and would otherwise wait for ranks that are long past it. The later
    /// point is believed only under a seal of one of the run's ranks (`sync.latest` itself is
    /// anyone's word).
    async fn went_past(&self, k: u64, ranks: usize, keys: &Keys) -> Result<bool> {
        let failed =
            |e: &dyn std::fmt::Display| self.failed(k, "cannot read the run's sync points", e);
        let last = latest_point(self.bucket).await.map_err(|e| failed(&e))?;
        let Some(last) = last.filter(|&last| last > k) else {
            return Ok(false);
        };
        let bytes = self
            .bucket
            .get(&live_key(last))
            .await
            .map_err(|e| failed(&e))?;
        let Some(agreed) = bytes.and_then(|bytes| decode(&bytes, ranks)) else {
            return Ok(false);
        };
        let statement = live_statement(self.run, last, &agreed.list, &agreed.joining_list);
        Ok(!agreed.live[self.rank]
            && !agreed.joining.contains(&self.rank)
            && keys.sealed_statement(agreed.proposer, &statement, &agreed.seal))
    }

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
    pub(super) async fn agree(
        &self,
        k: u64,
        previous: &[bool],
        mut watch: Option<&mut Box<dyn Watch>>,
        watched_before: bool,
    ) -> Result<(Vec<bool>, Vec<usize>)> {
        let prefix = format!("sync.{k}.");
        // This sync point's keys as the watch has shown them; updates of earlier sync points
        // are not this one's news.
        let mut seen = Seen::new();
        if let Some(w) = watch.as_deref_mut() {
            while let Some(update) = w.ready() {
                if update.key.starts_with(&prefix) {
                    seen.insert(update.key, update.value);
                }
            }
        }
        let ranks = previous.len();
        let keys: std::sync::Arc<Keys> = self.inbox.keys().ok_or_else(|| {
            Error::runtime(format!(
                "run '{}' rank {}: sync point {k} before the run's keys are known",
                self.run, self.rank
            ))
        })?;
        let arrival = Bytes::copy_from_slice(
            &self
                .signer
                .seal_statement(&arrival_statement(self.run, k, self.rank)),
        );
        self.bucket
            .put(&arrived_key(k, self.rank), arrival.clone())
            .await
            .map_err(|e| self.failed(k, "cannot say it arrived", &e))?;
        // A watch open since before this sync point began (`watched_before`: its first key is
        // put after this process arrived at the last one) has shown every key of it put so
        // far, so what it has not shown is absent and nothing is read. Otherwise every key is
        // read at first; and after a wait with no update, in case the watch missed one.
        let mut fresh = watched_before && watch.is_some();
        if fresh {
            seen.insert(arrived_key(k, self.rank), Some(arrival.clone()));
            seen.entry(live_key(k)).or_insert(None);
            for rank in (0..ranks).filter(|&r| previous[r]) {
                seen.entry(arrived_key(k, rank)).or_insert(None);
            }
        }
        let live = loop {
            if !fresh {
                seen.clear();
            }
            let agreed = self
                .read(&mut seen, live_key(k))
                .await
                .map_err(|e| self.failed(k, "cannot read the membership", &e))?;
            if let Some(bytes) = agreed {
                let agreed = decode(&bytes, ranks).ok_or_else(|| {
                    Error::runtime(format!(
                        "run '{}' rank {}: sync point {k}: the agreed membership '{}' is not a list of ranks of a run of {ranks}, its proposer and its seal",
                        self.run,
                        self.rank,
                        String::from_utf8_lossy(&bytes)
                    ))
                })?;
                let statement = live_statement(self.run, k, &agreed.list, &agreed.joining_list);
                if !previous[agreed.proposer]
                    || !keys.sealed_statement(agreed.proposer, &statement, &agreed.seal)
                {
                    self.inbox.note_forged();
                    return Err(Error::runtime(format!(
                        "run '{}' rank {}: sync point {k}: the agreed membership ({}) is forged: rank {}, whose proposal it claims to be, did not seal it",
                        self.run, self.rank, agreed.list, agreed.proposer
                    )));
                }
                break (agreed.live, agreed.joining);
            }
            if !fresh && self.went_past(k, ranks, &keys).await? {
                return Err(self.left_behind(k));
            }
            // Another client may have overwritten this rank's arrival: say it again.
            let own = self
                .read(&mut seen, arrived_key(k, self.rank))
                .await
                .map_err(|e| self.failed(k, "cannot read its arrival", &e))?;
            if own.as_deref() != Some(&arrival[..]) {
                self.bucket
                    .put(&arrived_key(k, self.rank), arrival.clone())
                    .await
                    .map_err(|e| self.failed(k, "cannot say it arrived", &e))?;
                seen.insert(arrived_key(k, self.rank), Some(arrival.clone()));
            }
            let mut arrived = vec![false; ranks];
            let mut open = false;
            for rank in (0..ranks).filter(|&r| previous[r]) {
                arrived[rank] = rank == self.rank || {
                    let said = self
                        .read(&mut seen, arrived_key(k, rank))
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
                // Every rank of the last membership arrived or is gone: propose, with the
                // ranks that asked to join. Of several proposals the server keeps the first;
                // the others read it above. A process that was suspended may find its peers
                // silent only because it has not yet read what they said meanwhile: if the
                // run is past this point, its keys may be gone, and it must not propose
                // without them (a point every rank arrived at needs no such check).
                let leaves_out = (0..ranks).any(|r| previous[r] && !arrived[r]);
                if leaves_out && self.went_past(k, ranks, &keys).await? {
                    return Err(self.left_behind(k));
                }
                let joining = self.join_requests(previous, &arrived).await?;
                let statement =
                    live_statement(self.run, k, &ranks_text(&arrived), &joining_text(&joining));
                let seal = self.signer.seal_statement(&statement);
                if self
                    .bucket
                    .create(&live_key(k), encode(&arrived, self.rank, &seal, &joining))
                    .await
                    .is_ok()
                {
                    // Where a joining process finds the run (`latest`).
                    let _ = self
                        .bucket
                        .put(LATEST_KEY, Bytes::from(k.to_string()))
                        .await;
                    break (arrived, joining);
                }
                fresh = false;
                continue;
            }
            fresh = bucket_changed(self.bucket, &mut watch, &prefix, &mut seen).await;
        };
        let (live, joining) = live;
        if !live[self.rank] {
            return Err(self.left_behind(k));
        }
        if k >= 2 {
            self.bucket.discard(&arrived_key(k - 2, self.rank)).await;
            if live.iter().position(|&l| l) == Some(self.rank) {
                self.bucket.discard(&live_key(k - 2)).await;
            }
        }
        Ok((live, joining))
    }

    /// The ranks outside the last membership (`previous`) and not `arrived` whose request to
    /// join is sealed by the key their claim now holds.
    async fn join_requests(&self, previous: &[bool], arrived: &[bool]) -> Result<Vec<usize>> {
        let mut joining = Vec::new();
        for rank in (0..previous.len()).filter(|&r| !previous[r] && !arrived[r]) {
            let request = self.bucket.get(&join_key(rank)).await.map_err(|e| {
                Error::runtime(format!(
                    "run '{}': cannot read the requests to join: {e}",
                    self.run
                ))
            })?;
            let Some(seal) = request else { continue };
            let Ok(claim) = read_claim(self.bucket, self.run, rank).await else {
                continue;
            };
            if Keys::sealed_by_key(&claim.key, &join_statement(self.run, rank), &seal) {
                joining.push(rank);
            } else {
                self.inbox.note_forged();
            }
        }
        Ok(joining)
    }
}
