//! Joining a running run (`NatsOptions::join`): the rank a process takes, and the heal that
//! brings it to where the live ranks are.
//!
//! A joining process takes the claim of a rank outside the run's last agreed membership (one
//! that left) and asks to join (`membership.rs` admits it at the next sync point). At the end
//! of that point every algorithm heals it ([`Communicator::heal_rows`],
//! [`Communicator::heal_bytes`]): the lowest live rank sends it each arena row and counter the
//! algorithm names, point to point, as messages numbered apart from the collectives (the joiner
//! has taken part in none). The first message of a heal carries the source's place in the run —
//! its next collective's sequence number, the membership it expects next and its count of sync
//! points — which the joiner adopts, so that from then on it makes the same collectives under
//! the same numbers as the live ranks; and the joiner starts its heartbeat then, once every live
//! rank holds its new key.
//!
//! [`Communicator::heal_rows`]: crate::comm::Communicator::heal_rows
//! [`Communicator::heal_bytes`]: crate::comm::Communicator::heal_bytes

use super::link::Bucket;
use super::{KIND_HEAL, NatsOptions, NatsWorld, join, membership};
use crate::backend::Arena;
use crate::comm::Membership;
use crate::error::{Error, Result};
use crate::transfer;

/// Heal messages are numbered from here (above any collective's sequence number), by
/// membership epoch and message.
const HEAL_SEQ: u64 = 1 << 62;

fn heal_seq(epoch: u64, i: u64) -> u64 {
    HEAL_SEQ | (epoch << 24) | i
}

impl NatsWorld {
    /// The ranks of `m` live at its next sync point: its live ranks and those joining after it.
    pub(super) fn with_joining(m: &Membership) -> Vec<bool> {
        let mut next = m.live.clone();
        for &r in &m.joining {
            if let Some(slot) = next.get_mut(r) {
                *slot = true;
            }
        }
        next
    }

    /// Takes the rank `options` asks for (or the lowest one) among those outside the run's last
    /// agreed membership, overwriting its claim with `own`: that sync point's index and the rank.
    /// Until one has left (a rank is dropped at the first sync point after it fell silent for the
    /// failure bound), it waits, at most `options.join_timeout`.
    ///
    /// # Errors
    /// A `RuntimeError` when within the timeout the run reaches no sync point or no rank (or not
    /// the one asked for) leaves it; a `ValueError` for a rank outside the run.
    pub(super) async fn take_left_rank(
        bucket: &dyn Bucket,
        run: &str,
        options: &NatsOptions,
        own: &join::Claim,
    ) -> Result<(u64, usize)> {
        let ranks = options.ranks;
        if let Some(rank) = options.rank.filter(|&r| r >= ranks) {
            return Err(Error::value(format!(
                "rank {rank} requested in run '{run}' of {ranks} ranks"
            )));
        }
        let deadline = web_time::Instant::now() + options.join_timeout;
        loop {
            let last = membership::latest(bucket, run, ranks).await?;
            if let Some((k, last)) = &last {
                let left = |r: usize| !last.live[r] && !last.joining.contains(&r);
                let rank = match options.rank {
                    Some(rank) => left(rank).then_some(rank),
                    None => (0..ranks).find(|&r| left(r)),
                };
                if let Some(rank) = rank {
                    join::take_over(bucket, run, rank, own).await?;
                    return Ok((*k, rank));
                }
            }
            if web_time::Instant::now() > deadline {
                let why = match (&last, options.rank) {
                    (None, _) => {
                        "it reached no sync point (a process joins a running run at one of them)"
                            .to_string()
                    }
                    (Some(_), Some(rank)) => {
                        format!(
                            "rank {rank} stayed live (a process joins as a rank that left the run)"
                        )
                    }
                    (Some(_), None) => {
                        format!("all its {ranks} ranks stayed live: there was none to join as")
                    }
                };
                return Err(Error::runtime(format!(
                    "run '{run}': nothing to join within {:.0} s: {why}",
                    options.join_timeout.as_secs_f64()
                )));
            }
            bucket.pause(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Asks to be taken in as this process's rank and waits until a sync point after `after`
    /// admits it: that point's membership.
    ///
    /// # Errors
    /// A `RuntimeError` when the request cannot be put, or no sync point admits it within the
    /// join timeout.
    pub(super) fn admission(&self, after: u64) -> Result<Membership> {
        let keys = self
            .inbox
            .keys()
            .ok_or_else(|| Error::runtime(format!("run '{}': no keys yet", self.run)))?;
        let request = self
            .signer
            .seal_statement(&join::join_statement(&self.run, self.rank));
        let key = join::join_key(self.rank);
        let (epoch, agreed) = self.runtime.block_on(async {
            let task = super::listen(&*self.link, &self.common, &self.inbox)
                .await
                .map_err(|e| {
                    Error::runtime(format!("run '{}': cannot subscribe: {e}", self.run))
                })?;
            self.tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(task);
            self.link.flush().await.map_err(|e| {
                Error::runtime(format!("run '{}': cannot reach the server: {e}", self.run))
            })?;
            // The live ranks' heartbeats are heard from now on: nobody's silence so far.
            self.inbox.all_heard();
            self.bucket
                .put(&key, bytes::Bytes::copy_from_slice(&request))
                .await
                .map_err(|e| {
                    Error::runtime(format!("run '{}': cannot ask to join: {e}", self.run))
                })?;
            let admission = membership::admission(
                &*self.bucket,
                &self.run,
                &keys,
                (self.rank, self.size),
                after,
                self.join_timeout,
            )
            .await;
            let _ = self.bucket.delete(&key).await;
            admission
        })?;
        Ok(Membership {
            epoch,
            live: agreed.live,
            joining: agreed.joining,
        })
    }

    /// Rank `rank`'s subject.
    pub(super) fn subject(&self, rank: usize) -> String {
        self.subjects.lock().unwrap_or_else(|e| e.into_inner())[rank].clone()
    }

    /// The ranks `joining` are held by processes that joined: their subjects and keys are
    /// read from their claims anew.
    ///
    /// # Errors
    /// A `RuntimeError` when a claim cannot be read or holds no valid key.
    pub(super) fn rejoined(&self, joining: &[usize]) -> Result<()> {
        for &rank in joining {
            let claim = self
                .runtime
                .block_on(join::read_claim(&*self.bucket, &self.run, rank))?;
            let keys = self
                .inbox
                .keys()
                .ok_or_else(|| Error::runtime(format!("run '{}': no keys yet", self.run)))?
                .replaced(&self.run, rank, &claim.key)?;
            self.subjects.lock().unwrap_or_else(|e| e.into_inner())[rank] =
                format!("distopt.{}.p.{}", self.run, claim.token);
            self.inbox.rejoined(rank, keys);
        }
        Ok(())
    }

    /// The next heal message's number between this process and `peer` (its joiner, or its
    /// source), with whether it is the heal's first (the source's place in the run).
    fn next_heal(&self, peer: usize) -> (u64, bool) {
        let mut heal = self.heal.lock().unwrap_or_else(|e| e.into_inner());
        let epoch = heal.0;
        let i = heal.1.entry(peer).or_insert(0);
        let n = *i;
        *i += 1;
        (heal_seq(epoch, n), n == 0)
    }

    /// Sends `payload` to `joiner` as the next message of its heal (after this process's place
    /// in the run, first).
    fn heal_send(&self, joiner: usize, payload: &[u8]) -> Result<()> {
        let subject = self.subject(joiner);
        let (seq, first) = self.next_heal(joiner);
        if first {
            let next = *self.seq.lock().unwrap_or_else(|e| e.into_inner());
            let (k, live) = self
                .elastic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let points = *self.points.lock().unwrap_or_else(|e| e.into_inner());
            let mut place = [next.to_le_bytes(), k.to_le_bytes(), points.to_le_bytes()].concat();
            place.extend(live.iter().map(|&l| u8::from(l)));
            self.send(&subject, seq, KIND_HEAL, &place)?;
            return self.heal_send(joiner, payload);
        }
        self.send(&subject, seq, KIND_HEAL, payload)
    }

    /// The next message of this process's heal from `source` (of `size` bytes when given),
    /// taking the source's place in the run from the first.
    fn heal_receive(&self, source: usize, size: Option<usize>) -> Result<Vec<u8>> {
        let (seq, first) = self.next_heal(source);
        if first {
            let place = self.receive(seq, source, KIND_HEAL, Some(24 + self.size))?;
            let word =
                |i: usize| u64::from_le_bytes(place[8 * i..8 * i + 8].try_into().expect("8"));
            let (next, k, points) = (word(0), word(1), word(2));
            let live: Vec<bool> = place[24..].iter().map(|&b| b != 0).collect();
            if !live[self.rank] {
                return Err(Error::runtime(format!(
                    "run '{}' rank {}: rank {source} heals this rank but does not expect it at the next sync point",
                    self.run, self.rank
                )));
            }
            *self.seq.lock().unwrap_or_else(|e| e.into_inner()) = next;
            *self.points.lock().unwrap_or_else(|e| e.into_inner()) = points;
            self.inbox.advance(next);
            self.inbox.set_live(&live);
            *self.elastic.lock().unwrap_or_else(|e| e.into_inner()) = (k, live);
            self.beating
                .store(true, std::sync::atomic::Ordering::Release);
            return self.heal_receive(source, size);
        }
        self.receive(seq, source, KIND_HEAL, size)
    }

    /// [`crate::comm::Communicator::heal_rows`] over NATS.
    pub(super) fn heal_arena(&self, arena: &mut Arena, source: usize, joiner: usize) -> Result<()> {
        if source == joiner || (self.rank != source && self.rank != joiner) {
            return Ok(());
        }
        self.check_one_rank(arena, "heal")?;
        let len = arena.rank_len();
        if self.rank == source {
            let data = transfer::read_row_words(arena, 0, 0, len)?;
            self.heal_send(joiner, bytemuck::cast_slice(&data))
        } else {
            let words = arena.format().words_for(len);
            let bytes = self.heal_receive(source, Some(words * 4))?;
            arena.write(0, 0, &bytemuck::pod_collect_to_vec::<u8, u32>(&bytes))
        }
    }

    /// [`crate::comm::Communicator::heal_bytes`] over NATS.
    pub(super) fn heal_data(&self, source: usize, joiner: usize, data: Vec<u8>) -> Result<Vec<u8>> {
        if source != joiner && self.rank == source {
            self.heal_send(joiner, &data)?;
        } else if source != joiner && self.rank == joiner {
            return self.heal_receive(source, None);
        }
        Ok(data)
    }
}
