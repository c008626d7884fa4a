//! Hostile inputs for the property tests of every parser of request data, and
//! the time budget they must keep (tests only).
//!
//! Every parser gets inputs of up to 64 KiB: uniformly random bytes, and short
//! motifs of the bytes that steer parsers (separators, quotes, escapes,
//! brackets) repeated to fill the length, which is where a parser that rescans
//! would go quadratic. Each parse must finish within [`BUDGET`].

use std::time::{Duration, Instant};

use proptest::prelude::*;

/// The largest input: 64 KiB, as much as one header line may plausibly carry.
pub(crate) const MAX_INPUT: usize = 64 * 1024;

/// What one parse of [`MAX_INPUT`] bytes may take. A linear parse of 64 KiB
/// takes a few milliseconds in a debug build, so even a machine whose cores
/// are shared with other builds stays far below this; a parse that rescans its
/// input (2^31 steps and more for 64 KiB) takes seconds even in release.
pub(crate) const BUDGET: Duration = Duration::from_secs(1);

/// Bytes that steer the parsers: list and parameter separators, quotes and
/// escapes, brackets and ports, the digits and letters of addresses and of
/// `for=` and `unknown`, path and media type separators, hash tag braces, and
/// bytes above ASCII.
const STEERING: &[u8] = b" \t,;=\"\\[]:_.%/+-{}0129afFORunkwgrpc\x80\xff";

/// Up to [`MAX_INPUT`] bytes that a header value may carry (visible ASCII,
/// space, tab and obs-text: everything but control bytes and DEL).
pub(crate) fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let valid = |b: u8| b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80;
    prop_oneof![
        (any::<u64>(), 0..=MAX_INPUT).prop_map(move |(seed, len)| {
            random_bytes(seed, len)
                .into_iter()
                .map(|b| if valid(b) { b } else { b'x' })
                .collect()
        }),
        motif(STEERING, MAX_INPUT),
    ]
}

/// Up to `max` bytes of `alphabet`: a motif of up to 24 of them, repeated.
pub(crate) fn motif(alphabet: &'static [u8], max: usize) -> impl Strategy<Value = Vec<u8>> {
    let motif = proptest::collection::vec(proptest::sample::select(alphabet), 1..24);
    (motif, 0..=max).prop_map(|(motif, len)| motif.iter().copied().cycle().take(len).collect())
}

/// `len` pseudo-random bytes from `seed` (xorshift64*): cheap to make at
/// 64 KiB, where a generated vector of that many elements would be slow.
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_be_bytes()[0]
        })
        .collect()
}

/// Runs `parse`, failing when it takes longer than [`BUDGET`].
pub(crate) fn within_budget<T>(what: &str, parse: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = parse();
    let took = start.elapsed();
    assert!(took < BUDGET, "{what} took {took:?}, over {BUDGET:?}");
    out
}

/// A proptest configuration for 64 KiB inputs: fewer cases than the default,
/// each much larger.
pub(crate) fn config() -> ProptestConfig {
    ProptestConfig::with_cases(32)
}
