//! Where a relay's next claim starts scanning the pending index.
//!
//! Every claim used to scan from the oldest pending row. Behind a backlog the head of
//! the index is where the other batch loops' locked rows are (`SKIP LOCKED` still
//! visits each of them) and where the rows marked by the last few batches still have
//! entries (not yet removable while batches overlap, so each costs a heap visit): a
//! claim of 500 rows walked over about 1 500 others and took four times as long as
//! the same claim alone (docs/design.md, "Where the relay's time goes").
//!
//! So the batch loops of a process share a cursor: after a full batch, the next claim
//! starts at the newest row claimed so far. Rows it passes over — a batch that failed
//! or was rolled back, a retry that became due, a row committed late with an older
//! `created_at`, rows another relay held — are claimed by a scan from the oldest row,
//! which happens whenever a claim comes back short of a full batch (the backlog is
//! drained up to its newest row) and at least every [`FROM_OLDEST_EVERY`]. No row is
//! left behind for longer than that while the relay works, and an idle relay always
//! scans from the oldest.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// The longest a claim scans from the cursor before it scans from the oldest row
/// again: how late, at most, a row passed over is picked up behind a backlog.
pub const FROM_OLDEST_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct ClaimCursor {
    state: Mutex<State>,
    from_oldest_every: Duration,
}

#[derive(Debug)]
struct State {
    /// `created_at` of the newest row claimed since the last scan from the oldest.
    newest_claimed: Option<DateTime<Utc>>,
    last_from_oldest: Instant,
}

impl Default for ClaimCursor {
    fn default() -> Self {
        ClaimCursor::new(FROM_OLDEST_EVERY)
    }
}

impl ClaimCursor {
    pub fn new(from_oldest_every: Duration) -> ClaimCursor {
        ClaimCursor {
            state: Mutex::new(State {
                newest_claimed: None,
                last_from_oldest: Instant::now(),
            }),
            from_oldest_every,
        }
    }

    /// Where the next claim starts: `None` scans from the oldest row.
    pub fn start(&self) -> Option<DateTime<Utc>> {
        let mut state = self.lock();
        if state.last_from_oldest.elapsed() >= self.from_oldest_every {
            state.newest_claimed = None;
        }
        if state.newest_claimed.is_none() {
            state.last_from_oldest = Instant::now();
        }
        state.newest_claimed
    }

    /// After a claim: a full batch moves the cursor to its newest row (claims return
    /// rows oldest first, so the last one); a short one means the scan reached the
    /// newest pending row, and the next claim starts from the oldest.
    pub fn claimed(&self, newest: Option<DateTime<Utc>>, full: bool) {
        let mut state = self.lock();
        state.newest_claimed = match (full, newest) {
            (true, Some(newest)) => Some(state.newest_claimed.map_or(newest, |n| n.max(newest))),
            _ => None,
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is two plain values, valid whatever a panicking holder did.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + second, 0).unwrap()
    }

    #[test]
    fn a_full_batch_moves_the_cursor_and_a_short_one_resets_it() {
        let cursor = ClaimCursor::new(Duration::from_secs(3600));
        assert_eq!(cursor.start(), None);
        cursor.claimed(Some(at(5)), true);
        assert_eq!(cursor.start(), Some(at(5)));
        // A concurrent loop's older full batch does not move it back.
        cursor.claimed(Some(at(3)), true);
        assert_eq!(cursor.start(), Some(at(5)));
        cursor.claimed(Some(at(9)), false);
        assert_eq!(cursor.start(), None);
        cursor.claimed(None, false);
        assert_eq!(cursor.start(), None);
    }

    #[test]
    fn the_oldest_row_is_scanned_again_after_the_interval() {
        let cursor = ClaimCursor::new(Duration::ZERO);
        cursor.claimed(Some(at(5)), true);
        assert_eq!(cursor.start(), None);
    }
}
