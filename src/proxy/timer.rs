//! [`LazyTimer`]: one timer per connection, whose deadline moves from one read or write to
//! the next without touching the runtime's timer wheel.
//!
//! `tokio::time::timeout` around each read that waits (a kept-alive connection's next head,
//! a backend's answer) registers a timer in the wheel and removes it when the read completes:
//! two wheel operations, under the time driver's lock, per request and per limit. A
//! connection keeps one [`Sleep`] instead. Moving the deadline later only records it; when
//! the timer fires before the current deadline it is re-armed there, at most once a limit's
//! length, as nginx updates its timer tree lazily. Only a deadline earlier than the armed one
//! (a shorter limit after a longer one) re-arms at once. A limit starts when its work first
//! waits: work done at its first poll (a write the socket takes at once) costs no clock read.
//!
//! [`timeout_once_waiting`] is the same rule for a limit without a connection's timer (a
//! request's body, an answer's write): `tokio::time::timeout` reads the clock when it is
//! made, even for work that is already done, as a body that came with its head is.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep, sleep_until, Instant, Sleep};

/// The limit passed before the work was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// A connection's timer: [`LazyTimer::limit`] runs one piece of work under a limit.
pub struct LazyTimer {
    /// Armed at or before `deadline`; boxed so that a connection's future stays small.
    sleep: Pin<Box<Sleep>>,
    deadline: Instant,
}

impl Default for LazyTimer {
    fn default() -> Self {
        // Not registered with the runtime until first polled.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        LazyTimer {
            sleep: Box::pin(sleep_until(far)),
            deadline: far,
        }
    }
}

impl LazyTimer {
    /// Runs `work` until it completes, or fails with [`TimedOut`] once `limit` has passed
    /// since it first had to wait. Work done at its first poll (a write the socket takes at
    /// once) never reads the clock or touches the timer.
    pub fn limit<F: Future>(&mut self, limit: Duration, work: F) -> Limited<'_, F> {
        Limited {
            timer: self,
            limit: Some(limit),
            work,
        }
    }

    /// Moves the deadline to `limit` from now; the timer is re-armed at once only when that
    /// is earlier than where it is armed.
    fn start(&mut self, limit: Duration) {
        self.deadline = Instant::now() + limit;
        if self.deadline < self.sleep.deadline() {
            self.sleep.as_mut().reset(self.deadline);
        }
    }
}

pin_project! {
    /// The future of [`LazyTimer::limit`]: the work and the timer, nothing more (it lives
    /// inside every connection's future, idle ones included).
    pub struct Limited<'t, F> {
        timer: &'t mut LazyTimer,
        // Until the work first waits.
        limit: Option<Duration>,
        #[pin]
        work: F,
    }
}

impl<F: Future> Future for Limited<'_, F> {
    type Output = Result<F::Output, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(Ok(done));
        }
        let timer = this.timer;
        if let Some(limit) = this.limit.take() {
            timer.start(limit);
        }
        while timer.sleep.as_mut().poll(cx).is_ready() {
            if timer.sleep.deadline() >= timer.deadline {
                return Poll::Ready(Err(TimedOut));
            }
            // Fired for an earlier deadline: armed again at the current one.
            let deadline = timer.deadline;
            timer.sleep.as_mut().reset(deadline);
        }
        Poll::Pending
    }
}

/// Runs `work` until it completes, or fails with [`TimedOut`] once `limit` has passed since
/// it first had to wait: work done at its first poll reads no clock and sets no timer.
pub fn timeout_once_waiting<F: Future>(limit: Duration, work: F) -> TimeoutOnceWaiting<F> {
    TimeoutOnceWaiting {
        limit,
        work,
        sleep: None,
    }
}

pin_project! {
    /// The future of [`timeout_once_waiting`].
    pub struct TimeoutOnceWaiting<F> {
        limit: Duration,
        #[pin]
        work: F,
        // Set when the work first waits.
        #[pin]
        sleep: Option<Sleep>,
    }
}

impl<F: Future> Future for TimeoutOnceWaiting<F> {
    type Output = Result<F::Output, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(done) = this.work.poll(cx) {
            return Poll::Ready(Ok(done));
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(sleep(*this.limit)));
        }
        match this.sleep.as_pin_mut().map(|sleep| sleep.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(TimedOut)),
            _ => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn work_done_in_time_is_returned() {
        let mut timer = LazyTimer::default();
        let done = timer
            .limit(Duration::from_secs(10), async {
                tokio::time::sleep(Duration::from_secs(9)).await;
                7
            })
            .await;
        assert_eq!(done, Ok(7));
    }

    #[tokio::test(start_paused = true)]
    async fn work_past_its_limit_times_out_at_the_limit() {
        let mut timer = LazyTimer::default();
        let start = Instant::now();
        let never = timer
            .limit(Duration::from_secs(10), std::future::pending::<()>())
            .await;
        assert_eq!(never, Err(TimedOut));
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_is_honoured_after_the_armed_one_fires() {
        let mut timer = LazyTimer::default();
        // Armed at 10 s by the first piece of work, which waits.
        let second = Duration::from_secs(1);
        timer
            .limit(Duration::from_secs(10), tokio::time::sleep(second))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        // The next one's limit ends at 15 s: the timer fires at 10 s and is re-armed.
        let start = Instant::now();
        let slow = timer
            .limit(Duration::from_secs(10), async {
                tokio::time::sleep(Duration::from_secs(8)).await;
            })
            .await;
        assert_eq!(slow, Ok(()));
        let never = timer
            .limit(Duration::from_secs(10), std::future::pending::<()>())
            .await;
        assert_eq!(never, Err(TimedOut));
        assert_eq!(start.elapsed(), Duration::from_secs(18));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_limit_after_a_longer_one_still_ends_on_time() {
        let mut timer = LazyTimer::default();
        let second = Duration::from_secs(1);
        timer
            .limit(Duration::from_secs(60), tokio::time::sleep(second))
            .await
            .unwrap();
        let start = Instant::now();
        let never = timer
            .limit(Duration::from_secs(2), std::future::pending::<()>())
            .await;
        assert_eq!(never, Err(TimedOut));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_once_waiting_counts_from_the_first_wait() {
        let limit = Duration::from_secs(5);
        assert_eq!(timeout_once_waiting(limit, async { 4 }).await, Ok(4));
        let start = Instant::now();
        let done = timeout_once_waiting(limit, tokio::time::sleep(Duration::from_secs(4))).await;
        assert_eq!(done, Ok(()));
        let start_waiting = Instant::now();
        let never = timeout_once_waiting(limit, std::future::pending::<()>()).await;
        assert_eq!(never, Err(TimedOut));
        assert_eq!(start_waiting.elapsed(), limit);
        assert_eq!(start.elapsed(), Duration::from_secs(9));
    }

    /// Work done at its first poll sets no timer: polled outside a runtime, where making one
    /// panics (as `tokio::time::timeout` would, at once).
    #[test]
    fn a_timeout_once_waiting_reads_no_clock_for_work_done_at_once() {
        let done = futures_poll_once(timeout_once_waiting(Duration::from_secs(1), async { 2 }));
        assert_eq!(done, Some(Ok(2)));
    }

    /// Polls `future` once, outside any runtime.
    fn futures_poll_once<F: Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn work_done_at_its_first_poll_leaves_the_timer_alone() {
        let mut timer = LazyTimer::default();
        let (far, armed) = (timer.deadline, timer.sleep.deadline());
        assert_eq!(
            timer.limit(Duration::from_secs(1), async { 3 }).await,
            Ok(3)
        );
        assert_eq!((timer.deadline, timer.sleep.deadline()), (far, armed));
        // Work that waits starts the limit.
        let waits = tokio::time::sleep(Duration::from_millis(1));
        timer.limit(Duration::from_secs(1), waits).await.unwrap();
        assert!(timer.sleep.deadline() < armed);
    }
}
