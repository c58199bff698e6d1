//! `airlock audit verify`: re-hashes every chain, checks every checkpoint's signature and
//! that the trail still holds what each one states, and names the first record of a chain
//! that was edited, deleted, inserted or reordered. Reads only.
//!
//! What it can tell: a record whose content no longer matches its link (edited); a number
//! missing in a chain, or a head beyond the last record (deleted); a record at a number
//! another record holds, a record in no chain, or a record the next one was not chained to
//! (inserted); a record whose content or link belongs at another number (reordered); a
//! chain that no longer ends at a checkpoint's hash (rewritten: consistent again, but not
//! the trail that was signed). Records after a chain's last checkpoint are unanchored: a
//! writer could have rewritten them whole; they are reported, not failed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::core::audit_chain::{self, ChainHead, ChainLink, Checkpoint, GENESIS};
use crate::core::error::StoreResult;
use crate::core::ports::audit::{AuditChains, StoredAudit};

/// What was done to the trail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tamper {
    Edited,
    Deleted,
    Inserted,
    Reordered,
    /// A chain consistent in itself that no longer ends at a checkpoint's hash.
    Rewritten,
    /// A checkpoint whose signature does not verify with the audit key.
    ForgedCheckpoint,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    pub kind: Tamper,
    pub chain: Option<String>,
    pub seq: Option<u64>,
    /// The record named (its `audit_id`), when there is one.
    pub audit_id: Option<String>,
    /// Where it is stored (row or item key).
    pub location: Option<String>,
    pub detail: String,
}

/// Records of a chain after its last checkpoint (or all of it when none covers it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unanchored {
    pub chain: String,
    pub from_seq: u64,
    pub to_seq: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub chains: usize,
    pub records: u64,
    /// Checkpoints whose signature verified.
    pub checkpoints: usize,
    /// Records stored without a link, from before the chains began (older than every
    /// linked record): listed, not proven.
    pub legacy: u64,
    pub problems: Vec<Problem>,
    pub unanchored: Vec<Unanchored>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Entry {
    link: ChainLink,
    content: String,
    audit_id: Option<String>,
    location: String,
}

fn audit_id(body: &serde_json::Value) -> Option<String> {
    body.get("audit_id")
        .and_then(|v| v.as_str())
        .map(String::from)
}

/// Verifies the whole trail. `from`: a checkpoint (an exported copy) to start each of its
/// chains from instead of their first record; it must verify. `extra`: more checkpoints to
/// check besides the stored ones (exported copies). `progress` is told the records read.
pub async fn verify(
    store: &dyn AuditChains,
    key: &p256::PublicKey,
    from: Option<&Checkpoint>,
    extra: &[Checkpoint],
    progress: &mut (dyn FnMut(u64) + Send),
) -> StoreResult<Report> {
    let mut report = Report::default();
    // Heads first: a record appended while the scan runs is beyond its head (unanchored),
    // never taken for a deleted one.
    let heads: HashMap<String, ChainHead> = store
        .heads()
        .await?
        .into_iter()
        .map(|h| (h.chain.clone(), h))
        .collect();
    let mut chains: HashMap<String, BTreeMap<u64, Vec<Entry>>> = HashMap::new();
    let mut unlinked: Vec<(StoredAudit, i64)> = Vec::new();
    let mut first_linked_at = i64::MAX;
    let mut after = None;
    loop {
        let (page, next) = store.records(after, 500).await?;
        for rec in page {
            report.records += 1;
            let at = rec.body.get("at").and_then(|v| v.as_i64()).unwrap_or(0);
            match rec.link.clone() {
                Some(link) => {
                    first_linked_at = first_linked_at.min(at);
                    chains
                        .entry(link.chain.clone())
                        .or_default()
                        .entry(link.seq)
                        .or_default()
                        .push(Entry {
                            content: audit_chain::content_hash_of(&rec.body),
                            audit_id: audit_id(&rec.body),
                            location: rec.location.clone(),
                            link,
                        });
                }
                None => unlinked.push((rec, at)),
            }
        }
        progress(report.records);
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    for (rec, at) in unlinked {
        if at < first_linked_at {
            report.legacy += 1;
            continue;
        }
        report.problems.push(Problem {
            kind: Tamper::Inserted,
            chain: None,
            seq: None,
            audit_id: audit_id(&rec.body),
            location: Some(rec.location),
            detail: "a record in no chain, newer than the chains' first records".into(),
        });
    }

    // Checkpoints: only signed ones anchor anything.
    let mut valid: Vec<Checkpoint> = Vec::new();
    let stored = store.checkpoints().await?;
    for cp in stored.iter().chain(extra.iter()).chain(from) {
        match cp.verify(key) {
            Ok(()) => valid.push(cp.clone()),
            Err(why) => report.problems.push(Problem {
                kind: Tamper::ForgedCheckpoint,
                chain: None,
                seq: None,
                audit_id: None,
                location: Some(format!("checkpoint {}", cp.checkpoint_id)),
                detail: why,
            }),
        }
    }
    let from = from.filter(|cp| cp.verify(key).is_ok());
    report.checkpoints = valid.len();

    let names: BTreeSet<String> = chains
        .keys()
        .chain(heads.keys())
        .cloned()
        .chain(
            valid
                .iter()
                .flat_map(|c| c.chains.iter().map(|h| h.chain.clone())),
        )
        .collect();
    report.chains = names.len();
    let empty = BTreeMap::new();
    for name in names {
        let entries = chains.get(&name).unwrap_or(&empty);
        let head = heads.get(&name);
        let anchors: Vec<(&Checkpoint, &ChainHead)> = valid
            .iter()
            .filter_map(|cp| cp.head(&name).map(|h| (cp, h)))
            .collect();
        let checker = ChainCheck {
            name: &name,
            entries,
            head,
            anchors: &anchors,
            start: from.and_then(|cp| cp.head(&name)),
        };
        checker.run(&mut report);
    }
    Ok(report)
}

struct ChainCheck<'a> {
    name: &'a str,
    entries: &'a BTreeMap<u64, Vec<Entry>>,
    head: Option<&'a ChainHead>,
    anchors: &'a [(&'a Checkpoint, &'a ChainHead)],
    start: Option<&'a ChainHead>,
}

impl ChainCheck<'_> {
    fn problem(&self, kind: Tamper, seq: u64, e: Option<&Entry>, detail: String) -> Problem {
        Problem {
            kind,
            chain: Some(self.name.to_string()),
            seq: Some(seq),
            audit_id: e.and_then(|e| e.audit_id.clone()),
            location: e.map(|e| e.location.clone()),
            detail,
        }
    }

    /// The one record at `seq` that links to `prev`, if any.
    fn genuine(&self, seq: u64, prev: &str) -> Option<&Entry> {
        self.entries
            .get(&seq)?
            .iter()
            .find(|e| e.link.prev_hash == prev && e.link.holds_for(&e.content))
    }

    /// Why the record at `seq` does not hold: where its content or link belongs.
    fn classify(&self, seq: u64, prev: &str, e: &Entry) -> Problem {
        if !e.link.holds_for(&e.content) {
            // Its link, moved: the hash it carries is the one of another number.
            let last = self.entries.keys().next_back().copied().unwrap_or(seq) + 1;
            let moved = (1..=last).find(|&j| {
                j != seq
                    && audit_chain::link_hash(self.name, j, &e.link.prev_hash, &e.content)
                        == e.link.hash
            });
            if let Some(j) = moved {
                return match j {
                    j if j + 1 == seq => self.problem(
                        Tamper::Inserted,
                        j,
                        self.entries.get(&j).and_then(|v| v.first()),
                        format!(
                            "a record was inserted at #{j}: the record written there now sits \
                             at #{seq}"
                        ),
                    ),
                    j if j == seq + 1 => self.problem(
                        Tamper::Deleted,
                        seq,
                        Some(e),
                        format!(
                            "the record at #{seq} was deleted: the record written at #{j} now \
                             sits there"
                        ),
                    ),
                    j => self.problem(
                        Tamper::Reordered,
                        seq,
                        Some(e),
                        format!("this record was written at #{j} and now sits at #{seq}"),
                    ),
                };
            }
            // Its content, moved: another number's link holds for it.
            let swapped = self.entries.iter().find_map(|(j, v)| {
                (*j != seq && v.iter().any(|o| o.link.holds_for(&e.content))).then_some(*j)
            });
            if let Some(j) = swapped {
                return self.problem(
                    Tamper::Reordered,
                    seq,
                    Some(e),
                    format!("this record's content was written at #{j}; it now sits at #{seq}"),
                );
            }
            return self.problem(
                Tamper::Edited,
                seq,
                Some(e),
                format!(
                    "its content no longer matches its hash {} (content hash now {})",
                    e.link.hash, e.content
                ),
            );
        }
        // Consistent in itself, but not chained to the record before it.
        let before = seq.checked_sub(1).filter(|s| *s > 0);
        match before {
            Some(b) if prev != GENESIS => self.problem(
                Tamper::Inserted,
                b,
                self.entries.get(&b).and_then(|v| v.first()),
                format!(
                    "the record at #{seq} was chained to {}, not to this record: this one was \
                     inserted in its place",
                    e.link.prev_hash
                ),
            ),
            _ => self.problem(
                Tamper::Edited,
                seq,
                Some(e),
                "its previous hash is not the chain's start".into(),
            ),
        }
    }

    fn run(&self, report: &mut Report) {
        let last_entry = self.entries.keys().next_back().copied().unwrap_or(0);
        let head_seq = self.head.map_or(0, |h| h.seq);
        let anchored = self.anchors.iter().map(|(_, h)| h.seq).max().unwrap_or(0);
        // Records beyond the head were appended after the heads were read (or without
        // moving the head): checked as far as they link, unanchored either way.
        let end = last_entry.max(head_seq).max(anchored);
        let (mut seq, mut prev) = match self.start {
            Some(h) => {
                match self.entries.get(&h.seq).and_then(|v| v.first()) {
                    Some(e) if e.link.hash == h.hash => {}
                    e => {
                        report.problems.push(self.problem(
                            Tamper::Rewritten,
                            h.seq,
                            e,
                            format!("the --from checkpoint states {} at #{}", h.hash, h.seq),
                        ));
                        return;
                    }
                }
                (h.seq, h.hash.clone())
            }
            None => (0, GENESIS.to_string()),
        };
        let mut hashes: HashMap<u64, String> = HashMap::new();
        while seq < end {
            seq += 1;
            let Some(found) = self.entries.get(&seq) else {
                let next = self
                    .entries
                    .range(seq..)
                    .next()
                    .and_then(|(_, v)| v.first());
                report.problems.push(self.problem(
                    Tamper::Deleted,
                    seq,
                    next,
                    match next {
                        Some(_) => {
                            format!("record #{seq} is missing (the record named follows it)")
                        }
                        None => format!(
                            "record #{seq} is missing (the chain's head or a checkpoint states it)"
                        ),
                    },
                ));
                return;
            };
            let Some(ok) = self.genuine(seq, &prev) else {
                let e = &found[0];
                report.problems.push(self.classify(seq, &prev, e));
                return;
            };
            if found.len() > 1 {
                let other = found.iter().find(|e| !std::ptr::eq(*e, ok));
                report.problems.push(self.problem(
                    Tamper::Inserted,
                    seq,
                    other,
                    format!("a second record at #{seq}; the chain goes through the other one"),
                ));
                return;
            }
            hashes.insert(seq, ok.link.hash.clone());
            prev = ok.link.hash.clone();
        }
        if let Some(h) = self.head {
            if hashes.get(&h.seq).is_some_and(|x| *x != h.hash) {
                report.problems.push(self.problem(
                    Tamper::Rewritten,
                    h.seq,
                    self.entries.get(&h.seq).and_then(|v| v.first()),
                    format!("the chain's head states {} at #{}", h.hash, h.seq),
                ));
                return;
            }
        }
        // Every checkpoint's head must be where the chain still is. The first record after
        // the last checkpoint that still matches is where the rewrite can begin.
        let mut good = self.start.map_or(0, |h| h.seq);
        let mut sorted: Vec<&(&Checkpoint, &ChainHead)> = self.anchors.iter().collect();
        sorted.sort_by_key(|(_, h)| h.seq);
        for (cp, h) in sorted {
            if h.seq <= self.start.map_or(0, |s| s.seq) {
                continue;
            }
            if hashes.get(&h.seq) == Some(&h.hash) {
                good = good.max(h.seq);
                continue;
            }
            let first = good + 1;
            report.problems.push(self.problem(
                Tamper::Rewritten,
                first,
                self.entries.get(&first).and_then(|v| v.first()),
                format!(
                    "checkpoint {} states {} at #{}; the chain now differs there: rewritten \
                     from #{first} (the record named) to #{}",
                    cp.checkpoint_id, h.hash, h.seq, h.seq
                ),
            ));
            return;
        }
        if end > anchored.max(self.start.map_or(0, |s| s.seq)) {
            report.unanchored.push(Unanchored {
                chain: self.name.to_string(),
                from_seq: anchored.max(self.start.map_or(0, |s| s.seq)) + 1,
                to_seq: end,
            });
        }
    }
}
