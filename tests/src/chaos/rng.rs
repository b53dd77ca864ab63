//! Seeded randomness: rand's `StdRng`, from one seed printed at the start of a scenario.

use rand::SeedableRng;
use rand::rngs::StdRng;
use uuid::Uuid;

/// The random choices of one scenario, from one seed printed at its start
/// (`CHAOS_SEED=<n>` replays them).
pub fn seeded_rng(scenario: &str) -> StdRng {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0);
    eprintln!("chaos {scenario}: seed {seed} (CHAOS_SEED={seed} replays these choices)");
    StdRng::seed_from_u64(seed)
}
