//! The library's one deterministic pseudo-random generator: SplitMix64 (Steele, Lea and
//! Flood, 2014), the same stream on every platform and in every front end.
//!
//! It seeds the trainer's data, initial parameters and mini-batches, and the test and
//! benchmark values. It is not cryptographic.
//!
//! ```
//! use distopt::rng::SplitMix64;
//! let mut a = SplitMix64::new(7, 1);
//! let mut b = SplitMix64::new(7, 1);
//! assert_eq!(a.next_u64(), b.next_u64());
//! let u = a.uniform();
//! assert!((0.0..1.0).contains(&u));
//! assert!(a.below(10) < 10);
//! ```

/// SplitMix64's finalizer of `a` and `b` combined: a well-mixed 64-bit value from two (a seed
/// and a stream number, a rank and a step, …).
pub fn mix(a: u64, b: u64) -> u64 {
    finalize(
        a ^ b
            .wrapping_add(GOLDEN_GAMMA)
            .wrapping_mul(0xD6E8_FEB8_6659_FD93),
    )
}

/// The increment of the generator's state (2⁶⁴ / φ, odd).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 generator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator of stream `stream` of seed `seed` (independent-looking streams of one
    /// seed: the data, the initial parameters, …).
    pub fn new(seed: u64, stream: u64) -> SplitMix64 {
        SplitMix64(mix(seed, stream))
    }

    /// The generator whose state is `state`: the textbook SplitMix64 seeded with `state`.
    pub fn from_state(state: u64) -> SplitMix64 {
        SplitMix64(state)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        finalize(self.0)
    }

    /// Uniform in `[0, 1)`, on a grid of 2⁻⁵³.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[-1, 1)`, on a grid of 2⁻⁵².
    pub fn signed_unit(&mut self) -> f64 {
        self.uniform() * 2.0 - 1.0
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; `n` must be positive, 0 gives 0).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * libm::log(u1)).sqrt() * libm::cos(std::f64::consts::TAU * u2)
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference stream of SplitMix64 seeded with 1234567 (from the authors' C code).
    #[test]
    fn matches_the_reference_stream() {
        let mut rng = SplitMix64::from_state(1_234_567);
        let expected = [
            6_457_827_717_110_365_317u64,
            3_203_168_211_198_807_973,
            9_817_491_932_198_370_423,
            4_593_380_528_125_082_431,
            16_408_922_859_458_223_821,
        ];
        for e in expected {
            assert_eq!(rng.next_u64(), e);
        }
    }

    #[test]
    fn ranges() {
        let mut rng = SplitMix64::new(3, 4);
        let mut seen = [0usize; 7];
        for _ in 0..7000 {
            seen[rng.below(7)] += 1;
            let s = rng.signed_unit();
            assert!((-1.0..1.0).contains(&s));
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        let mut items: Vec<usize> = (0..50).collect();
        rng.shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(items, sorted);
    }
}
