//! Seeded randomness (no extra dependency): xorshift64*.

use std::time::Duration;

use uuid::Uuid;

/// Random choices of one scenario, from one seed printed at its start
/// (`CHAOS_SEED=<n>` replays them).
pub struct Rng(u64);

impl Rng {
    pub fn seeded(scenario: &str) -> Rng {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0);
        eprintln!("chaos {scenario}: seed {seed} (CHAOS_SEED={seed} replays these choices)");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low + 1))
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}
