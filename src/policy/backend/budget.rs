//! An address's connection budget (`upstream.max_connections_per_address`): every connection
//! open to it counts, idle ones in the pool included, since that is what the backend sees. A
//! request reuses an idle connection, or opens one while the address is under its budget, or
//! waits in the address's FIFO queue; the queue holds at most `upstream.max_pending` requests
//! of all addresses together, and a request that finds it full is refused at once. A request
//! never jumps the queue: while others wait for an address, a newcomer waits behind them.
//! Connections past a budget a reload lowered ([`excess`]) are not kept idle: the idle ones
//! close at once, the busy ones once their answer is done.

use std::collections::VecDeque;

/// What a request that found no idle connection to reuse does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Open a new connection (it counts from now).
    Connect,
    /// Wait for a connection to come back or close.
    Wait,
}

/// Whether an address with `open` connections and `waiting` requests queued for it takes one
/// more connection under `max` (`None`: unlimited).
pub fn admit(open: usize, max: Option<usize>, waiting: usize) -> Admission {
    match max {
        None => Admission::Connect,
        Some(max) if waiting == 0 && open < max => Admission::Connect,
        Some(_) => Admission::Wait,
    }
}

/// How many of `waiting` requests may open a connection now to an address with `open`, under
/// `max` (`None`: unlimited): those a reload that raised the budget wakes, which would
/// otherwise wait for a connection to come back while the new budget has room.
pub fn room(open: usize, max: Option<usize>, waiting: usize) -> usize {
    max.map_or(waiting, |max| max.saturating_sub(open).min(waiting))
}

/// How many of `open` connections are past `max` (`None`: unlimited), as they are after a
/// reload that lowered it: that many are closed rather than kept idle.
pub fn excess(open: usize, max: Option<usize>) -> usize {
    max.map_or(0, |max| open.saturating_sub(max))
}

/// Whether an idle connection may be reused: not while others wait for one.
pub fn may_reuse(waiting: usize) -> bool {
    waiting == 0
}

/// Whether one more request may wait when `pending` already do, of `max_pending`.
pub fn may_wait(pending: usize, max_pending: usize) -> bool {
    pending < max_pending
}

/// The requests waiting for one address, oldest first, each known by the id it was given so
/// that one that gives up can leave from anywhere in the line.
#[derive(Debug)]
pub struct Queue<W> {
    waiting: VecDeque<(u64, W)>,
    next_id: u64,
}

impl<W> Default for Queue<W> {
    fn default() -> Self {
        Queue {
            waiting: VecDeque::new(),
            next_id: 0,
        }
    }
}

impl<W> Queue<W> {
    /// Puts `waiter` at the end of the line; its id.
    pub fn push(&mut self, waiter: W) -> u64 {
        let id = self.new_id();
        self.waiting.push_back((id, waiter));
        id
    }

    /// Puts `waiter` at the head of the line, before everyone in it: a waiter that was woken,
    /// found no connection (a newcomer took it first) and must wait again keeps its place.
    pub fn push_first(&mut self, waiter: W) -> u64 {
        let id = self.new_id();
        self.waiting.push_front((id, waiter));
        id
    }

    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// The oldest waiter, out of the line.
    pub fn pop(&mut self) -> Option<W> {
        self.waiting.pop_front().map(|(_, w)| w)
    }

    /// Takes the waiter `id` out of the line; `None` when it is no longer in it.
    pub fn remove(&mut self, id: u64) -> Option<W> {
        let at = self.waiting.iter().position(|(i, _)| *i == id)?;
        self.waiting.remove(at).map(|(_, w)| w)
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_connects_under_the_budget_and_waits_at_it_or_behind_others() {
        assert_eq!(admit(1000, None, 0), Admission::Connect);
        assert_eq!(admit(3, Some(4), 0), Admission::Connect);
        assert_eq!(admit(4, Some(4), 0), Admission::Wait);
        assert_eq!(
            admit(3, Some(4), 1),
            Admission::Wait,
            "no jumping the queue"
        );
        assert!(may_reuse(0) && !may_reuse(2));
        assert_eq!(room(1, Some(4), 2), 2);
        assert_eq!(room(1, Some(4), 5), 3);
        assert_eq!(room(6, Some(4), 5), 0, "over a lowered budget");
        assert_eq!(room(1, None, 5), 5);
        assert_eq!(excess(6, Some(4)), 2, "a lowered budget");
        assert_eq!(excess(3, Some(4)), 0);
        assert_eq!(excess(1000, None), 0);
        assert!(may_wait(0, 1) && !may_wait(1, 1) && !may_wait(0, 0));
    }

    #[test]
    fn the_queue_is_first_in_first_out_and_a_waiter_can_leave_it() {
        let mut q = Queue::default();
        let a = q.push('a');
        let b = q.push('b');
        q.push('c');
        assert_eq!(q.remove(b), Some('b'));
        assert_eq!(q.remove(b), None);
        assert_eq!(q.pop(), Some('a'));
        assert_eq!(q.remove(a), None);
        assert_eq!((q.len(), q.pop(), q.is_empty()), (1, Some('c'), true));
        q.push('d');
        let e = q.push_first('e');
        assert_eq!(q.pop(), Some('e'));
        assert_eq!(q.remove(e), None);
        assert_eq!(q.pop(), Some('d'));
    }
}
