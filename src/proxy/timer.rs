//! [`LazyTimer`]: one timer per connection, whose deadline moves from one read or write to
//! the next without touching the runtime's timer wheel.
//!
//! `tokio::time::timeout` around each read that waits (a kept-alive connection's next head,
//! a backend's answer) registers a timer in the wheel and removes it when the read completes:
//! two wheel operations, under the time driver's lock, per request and per limit. A
//! connection keeps one [`Sleep`] instead. Moving the deadline later only records it; when
//! the timer fires before the current deadline it is re-armed there, at most once a limit's
//! length, as nginx updates its timer tree lazily. Only a deadline earlier than the armed one
//! (a shorter limit after a longer one) re-arms at once.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{sleep_until, Instant, Sleep};

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
    /// Runs `work` until it completes, or fails with [`TimedOut`] once `limit` from now has
    /// passed.
    pub async fn limit<F: Future>(
        &mut self,
        limit: Duration,
        work: F,
    ) -> Result<F::Output, TimedOut> {
        self.deadline = Instant::now() + limit;
        if self.deadline < self.sleep.deadline() {
            self.sleep.as_mut().reset(self.deadline);
        }
        let mut work = pin!(work);
        poll_fn(|cx| {
            if let Poll::Ready(done) = work.as_mut().poll(cx) {
                return Poll::Ready(Ok(done));
            }
            while self.sleep.as_mut().poll(cx).is_ready() {
                if self.sleep.deadline() >= self.deadline {
                    return Poll::Ready(Err(TimedOut));
                }
                // Fired for an earlier deadline: armed again at the current one.
                let deadline = self.deadline;
                self.sleep.as_mut().reset(deadline);
            }
            Poll::Pending
        })
        .await
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
        // Armed at 10 s by the first piece of work.
        timer
            .limit(Duration::from_secs(10), async {})
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
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
        timer
            .limit(Duration::from_secs(60), async {})
            .await
            .unwrap();
        let start = Instant::now();
        let never = timer
            .limit(Duration::from_secs(2), std::future::pending::<()>())
            .await;
        assert_eq!(never, Err(TimedOut));
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
