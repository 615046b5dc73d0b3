//! The session's slot table: which slots are free, the sequence id each sends next, and
//! which slot's last request may or may not have reached the server.

use super::ops::{ChannelAttrs, Sequence, SessionId};
use super::session::Session;

/// Slots used at most, whatever the server offers.
pub const MAX_SLOTS: u32 = 64;

#[derive(Debug)]
pub(super) struct Slots {
    /// The sequence id each slot sends next.
    pub(super) seq: Vec<u32>,
    /// The slot's last request may or may not have reached the server.
    uncertain: Vec<bool>,
    busy: Vec<bool>,
    /// Slots usable now (the server's target highest slot id + 1, bounded).
    limit: usize,
    /// The client id and session these slots belong to, and how many recoveries
    /// replaced them.
    pub(super) clientid: u64,
    pub(super) id: SessionId,
    pub(super) generation: u64,
}

impl Slots {
    pub(super) fn new(
        clientid: u64,
        id: SessionId,
        generation: u64,
        channel: &ChannelAttrs,
    ) -> Self {
        let n = channel.max_requests.clamp(1, MAX_SLOTS) as usize;
        Self {
            seq: vec![1; n],
            uncertain: vec![false; n],
            busy: vec![false; n],
            limit: n,
            clientid,
            id,
            generation,
        }
    }

    /// Takes a free slot for `session`, if one is.
    fn take<'a>(&mut self, session: &'a Session) -> Option<SlotGuard<'a>> {
        let index = self.busy[..self.limit].iter().position(|b| !b)?;
        self.busy[index] = true;
        let highest = self.busy.iter().rposition(|b| *b).unwrap_or(index) as u32;
        Some(SlotGuard {
            session,
            generation: self.generation,
            id: self.id,
            index,
            seqid: self.seq[index],
            uncertain: self.uncertain[index],
            highest,
            released: false,
        })
    }

    /// Frees slot `index`, which sent `seqid`; false when a SEQ_MISORDERED could not be
    /// repaired.
    fn free(&mut self, index: usize, seqid: u32, how: Release) -> bool {
        self.busy[index] = false;
        match how {
            Release::Unsent => true,
            Release::Uncertain => {
                self.seq[index] = seqid.wrapping_add(1);
                self.uncertain[index] = true;
                true
            }
            Release::Done { target_highest } => {
                self.seq[index] = seqid.wrapping_add(1);
                self.uncertain[index] = false;
                let n = self.seq.len();
                self.limit = (target_highest as usize).saturating_add(1).clamp(1, n);
                true
            }
            Release::Misordered if self.uncertain[index] => {
                self.seq[index] = seqid.wrapping_sub(1);
                self.uncertain[index] = false;
                true
            }
            Release::Misordered => false,
        }
    }
}

/// How a slot's request ended.
pub(super) enum Release {
    /// SEQUENCE was not executed: the sequence id is unused.
    Unsent,
    /// No reply: the server may or may not have executed it.
    Uncertain,
    /// SEQUENCE executed; the server would like this many slots at most.
    Done { target_highest: u32 },
    /// SEQ_MISORDERED after an uncertain request: the server never saw it.
    Misordered,
}

/// A slot held for one request; released as uncertain when dropped unreleased (the
/// caller was cancelled mid-request).
pub(super) struct SlotGuard<'a> {
    session: &'a Session,
    pub(super) generation: u64,
    id: SessionId,
    index: usize,
    seqid: u32,
    pub(super) uncertain: bool,
    highest: u32,
    released: bool,
}

impl SlotGuard<'_> {
    /// The SEQUENCE arguments of the request on this slot.
    pub(super) fn sequence(&self) -> Sequence {
        Sequence {
            session: self.id,
            seqid: self.seqid,
            slot: self.index as u32,
            highest_slot: self.highest,
        }
    }

    /// Frees the slot; false when a SEQ_MISORDERED could not be repaired.
    pub(super) fn release(mut self, how: Release) -> bool {
        self.released = true;
        self.session
            .release(self.generation, self.index, self.seqid, how)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.session
                .release(self.generation, self.index, self.seqid, Release::Uncertain);
        }
    }
}

impl Session {
    /// A free slot, waiting for one when all are busy.
    pub(super) async fn acquire(&self) -> SlotGuard<'_> {
        loop {
            if let Some(slot) = self.slots.lock().take(self) {
                return slot;
            }
            self.slot_free.notified().await;
        }
    }

    /// Frees a slot; false when a SEQ_MISORDERED could not be repaired.
    fn release(&self, generation: u64, index: usize, seqid: u32, how: Release) -> bool {
        let repaired = {
            let mut st = self.slots.lock();
            // A slot of a session a recovery replaced: nothing to update.
            st.generation != generation || st.free(index, seqid, how)
        };
        self.slot_free.notify_one();
        repaired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel(max_requests: u32) -> ChannelAttrs {
        ChannelAttrs {
            header_pad: 0,
            max_request: 1 << 20,
            max_response: 1 << 20,
            max_response_cached: 4096,
            max_ops: 8,
            max_requests,
        }
    }

    #[test]
    fn sequence_ids_advance_and_misordered_uncertain_slots_step_back() {
        let mut s = Slots::new(1, [0; 16], 0, &channel(1000));
        assert_eq!(s.seq.len(), MAX_SLOTS as usize, "bounded");
        s.busy[0] = true;
        assert!(s.free(0, 1, Release::Uncertain));
        assert_eq!((s.seq[0], s.uncertain[0]), (2, true));
        s.busy[0] = true;
        assert!(s.free(0, 2, Release::Misordered), "repaired");
        assert_eq!((s.seq[0], s.uncertain[0]), (1, false));
        s.busy[0] = true;
        assert!(
            !s.free(0, 1, Release::Misordered),
            "a certain slot cannot be"
        );
        s.busy[0] = true;
        assert!(s.free(0, 1, Release::Done { target_highest: 3 }));
        assert_eq!((s.seq[0], s.limit), (2, 4));
    }
}
