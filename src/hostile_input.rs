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

/// The processor time one parse of [`MAX_INPUT`] bytes may take. A linear
/// parse of 64 KiB takes a few milliseconds in a debug build; a parse that
/// rescans its input (2^31 steps and more for 64 KiB) takes seconds even in
/// release. The time the thread spends waiting for a core is not counted
/// where the system tells it apart (see [`within_budget`]).
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

/// Runs `parse` on this thread, failing when it takes longer than [`BUDGET`]
/// of this thread's processor time (or of wall time where the system does
/// not say).
///
/// Wall time alone fails at random on a busy machine: with other builds on
/// both cores, a thread that needs 20 ms can wait over a second for them.
pub(crate) fn within_budget<T>(what: &str, parse: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let cpu_start = thread_cpu_time();
    let out = parse();
    let wall = start.elapsed();
    let cpu = cpu_start.and_then(|s| Some(thread_cpu_time()?.saturating_sub(s)));
    let (took, clock) = match cpu {
        Some(cpu) => (cpu, "processor time"),
        None => (wall, "wall time"),
    };
    assert!(
        took < BUDGET,
        "{what} took {took:?} of {clock}, over {BUDGET:?}"
    );
    out
}

/// The processor time this thread has used: the first field of Linux's
/// `/proc/thread-self/schedstat`, in nanoseconds. `None` elsewhere.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Cases a run makes unless `PROPTEST_CASES` asks for more: fewer than
/// proptest's default, as each case is much larger.
pub(crate) const CASES: u32 = 32;

/// A proptest configuration for 64 KiB inputs: [`CASES`] cases, or more when
/// `PROPTEST_CASES` asks for them (a long run that hunts rare inputs), never
/// fewer.
pub(crate) fn config() -> ProptestConfig {
    // Read here rather than through `ProptestConfig::default()`, whose
    // fallback without the variable is proptest's 256 cases.
    let asked = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0);
    ProptestConfig::with_cases(asked.max(CASES))
}
