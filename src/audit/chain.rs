//! The per-team hash chain: `hash = SHA-256(prev_hash || RFC 8785 JSON of the event and its seq)`,
//! so changing, deleting or inserting an event breaks the chain there.

use super::{AuditEvent, digest};
use serde::Serialize;

/// The `prev_hash` of a team's first event.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Where a team's chain ends ([`Default`]: before its first event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Last sequence number.
    pub seq: i64,
    /// Last hash.
    pub hash: String,
}

impl Default for Head {
    fn default() -> Self {
        Self {
            seq: 0,
            hash: GENESIS.to_owned(),
        }
    }
}

/// An event linked into its chain: as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Linked {
    /// The event.
    pub event: AuditEvent,
    /// Its position in its team's chain, from 1.
    pub seq: i64,
    /// The previous event's hash.
    pub prev_hash: String,
    /// Its own hash.
    pub hash: String,
}

#[derive(Serialize)]
struct Hashed<'a> {
    seq: i64,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

/// The hash of `event` at `seq` after `prev_hash`.
pub fn hash(prev_hash: &str, seq: i64, event: &AuditEvent) -> String {
    let json = super::canonical::event(seq, event).unwrap_or_else(|| {
        let value = serde_json::to_value(Hashed { seq, event }).unwrap_or_default();
        digest::canonical(&value)
    });
    digest::sha256_hex_of(&[prev_hash.as_bytes(), &json])
}

/// Links `events`, all of one team and in order, after `head`; returns the new head too.
pub fn link(head: &Head, events: impl IntoIterator<Item = AuditEvent>) -> (Vec<Linked>, Head) {
    let mut head = head.clone();
    let mut out = Vec::new();
    for event in events {
        let seq = head.seq + 1;
        let h = hash(&head.hash, seq, &event);
        out.push(Linked {
            event,
            seq,
            prev_hash: std::mem::replace(&mut head.hash, h.clone()),
            hash: h,
        });
        head.seq = seq;
    }
    (out, head)
}

/// The first event with a wrong hash, a wrong `prev_hash` or a sequence gap before it.
pub fn first_broken<'a>(events: impl IntoIterator<Item = &'a Linked>) -> Option<&'a Linked> {
    let mut head = Head::default();
    for e in events {
        let broken = e.seq != head.seq + 1
            || e.prev_hash != head.hash
            || hash(&e.prev_hash, e.seq, &e.event) != e.hash;
        if broken {
            return Some(e);
        }
        head = Head {
            seq: e.seq,
            hash: e.hash.clone(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Category;

    fn event(i: usize) -> AuditEvent {
        let mut e = AuditEvent::new(
            "t1",
            "crm-key",
            &format!("trace-{i}"),
            Category::Tool,
            "tool.call",
            "system.echo@1.0.0",
        )
        .decided("allow", "");
        e.at_ms = 1_790_000_000_000 + i as i64;
        e
    }

    #[test]
    fn a_chain_links_each_event_to_the_one_before() {
        let (linked, head) = link(&Head::default(), (1..=3).map(event));
        assert_eq!(linked[0].prev_hash, GENESIS);
        assert_eq!(linked[1].prev_hash, linked[0].hash);
        assert_eq!(head.seq, 3);
        assert_eq!(head.hash, linked[2].hash);
        assert!(first_broken(&linked).is_none());
        let (more, _) = link(&head, [event(4)]);
        assert_eq!((more[0].seq, more[0].prev_hash.clone()), (4, head.hash));
        let all: Vec<_> = linked.iter().chain(&more).collect();
        assert!(first_broken(all).is_none());
    }

    #[test]
    fn tampering_breaks_the_chain_at_the_changed_event() {
        let (linked, _) = link(&Head::default(), (1..=5).map(event));
        let mut changed = linked.clone();
        changed[2].event.decision = "deny".into();
        assert_eq!(first_broken(&changed).map(|e| e.seq), Some(3));
        changed[2].hash = hash(&changed[2].prev_hash, 3, &changed[2].event);
        assert_eq!(first_broken(&changed).map(|e| e.seq), Some(4));
        let mut deleted = linked.clone();
        deleted.remove(1);
        assert_eq!(first_broken(&deleted).map(|e| e.seq), Some(3));
        assert_eq!(first_broken(&linked[1..]).map(|e| e.seq), Some(2));
    }
}
