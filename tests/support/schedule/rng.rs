//! A small seeded generator (SplitMix64): a schedule is its seed, so a
//! failing one replays from the number printed, with no crate to pin.

/// SplitMix64 (Steele, Lea and Flood 2014): fast, and every seed is good.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A number in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// A number in `[lo, hi)` whose logarithm is uniform: as many short
    /// lease periods as long ones.
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }

    /// An exponential variate of mean `mean`: the gaps of a Poisson stream.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.next_u64() as usize % items.len()]
    }

    /// An independent generator for one task: the plan and every worker
    /// draw from their own, so a worker's draws do not shift the plan's.
    pub fn fork(&mut self) -> Rng {
        Rng(self.next_u64())
    }
}
