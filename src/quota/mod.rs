//! What a limit is: a bucket capacity (burst) and a refill rate.

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;
#[cfg(feature = "serde")]
mod serde_text;
mod text;

/// Largest value the store arithmetic may reach. Lua numbers are doubles, exact
/// only below 2^53; staying at or below 2^52 leaves room for the sums the bucket
/// computes (level + elapsed x rate never exceeds twice this bound).
pub(crate) const MAX_EXACT: u64 = 1 << 52;

/// The longest wait or reset a decision reports, in microseconds (2^53,
/// about 285 years): past it a Lua number is not exact, so every store
/// reports this bound instead (`MAX_REPORTED` in `lua/token_bucket.lua`).
pub(crate) const MAX_REPORTED_US: u64 = 1 << 53;

/// The longest period a quota may have.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The shortest period a quota may have.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);

/// A token bucket: `capacity` tokens at most, refilled at `tokens` per `period`.
///
/// Build it with [`Quota::per_second`], [`Quota::per_minute`], [`Quota::per_hour`]
/// or [`Quota::new`]; each checks its values and returns a [`ConfigError`]
/// for zero, absurd, or inexact ones.
///
/// # Text form
///
/// Quotas also parse from text ([`FromStr`](std::str::FromStr)), for
/// configuration files and environment variables, and [`Display`](std::fmt::Display)
/// writes that form back, so a quota printed and parsed again is the same
/// quota:
///
/// ```text
/// <tokens> "/" [<count>] <unit> [","] ["burst" <capacity>] [","] ["lockout" [<count>] <unit>]
/// ```
///
/// | text | same as |
/// | --- | --- |
/// | `10/s` | `Quota::per_second(10)` |
/// | `100/min` | `Quota::per_minute(100)` |
/// | `5000/h` | `Quota::per_hour(5000)` |
/// | `1/day` | `Quota::new(1, Duration::from_secs(86_400))` |
/// | `10/s burst 50` | `Quota::per_second(10)?.burst(50)` |
/// | `3/1500ms`, `2/15min` | `Quota::new(3, 1500 ms)`, `Quota::new(2, 15 min)` |
/// | `5/15min lockout 15min` | `Quota::new(5, 15 min)?.lockout(15 min)` ([`lockout`](Quota::lockout)) |
///
/// - **Units**: `us` (`µs`), `ms`, `s`, `min` (`m`), `h`, `d`, `w`, or their
///   names (`sec`, `second`, `seconds`, `minute`, `hour`, `day`, `week`...),
///   in any ASCII case. `m` is a minute, never a month or a millisecond.
/// - **Numbers** are plain decimal digits: no sign, fraction or separator.
///   `/` may also be written `per` (`10 per second`).
/// - **Spaces** are optional around numbers, `/` and `,`, and needed only
///   between two words (`10 per s`): `10/s`, `10 / s` and `10/1s` are one quota.
/// - **Mistakes** are the constructors' errors, naming the text: `"0/s"` gives
///   `invalid quota: "0/s": tokens per period must be at least 1`; an unknown
///   unit, a number past `u64` or any other text says what was expected.
///
/// `Display` writes the shortest form: the count only when it is not 1, the
/// largest of `d`, `h`, `min`, `s`, `ms`, `us` that divides the period, and
/// the burst only when it differs from the tokens (`10/s`, `2/15min`,
/// `10/s burst 50`), and the lock-out when there is one, with its count
/// (`5/15min lockout 15min`, `10/s lockout 1s`). With the `serde` cargo feature a quota serializes as this
/// text and deserializes from it.
///
/// Internally the rate is kept as the reduced fraction `num / den` tokens per
/// microsecond, and bucket levels are counted in units of `1 / den` token, so every
/// refill is an exact integer: no token is ever lost to rounding.
///
/// `Quota::per_minute(60)` means 60 tokens refilled per minute (one a second) and a
/// bucket that holds 60, not "one token every 60 seconds". `.burst(n)` changes the
/// capacity without changing the rate.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// # fn main() -> Result<(), tollgate::ConfigError> {
/// let api = Quota::per_second(10)?.burst(20)?; // 10/s, bursts of 20
/// let daily = Quota::new(1_000, Duration::from_secs(86_400))?; // 1000 a day
/// assert_eq!(api.capacity(), 20);
/// assert_eq!(daily.period(), Duration::from_secs(86_400));
/// assert!(Quota::per_second(0).is_err());
///
/// // The text form, as in configuration files; `Display` writes it back.
/// let login: Quota = "5/min burst 10".parse()?;
/// assert_eq!(login, Quota::per_minute(5)?.burst(10)?);
/// assert_eq!(login.to_string(), "5/min burst 10");
/// assert_eq!("100/min".parse::<Quota>()?, Quota::per_minute(100)?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct Quota {
    tokens: u64,
    period_us: u64,
    capacity: u64,
    /// Refill per microsecond is `num / den` tokens (the reduced `tokens / period_us`).
    num: u64,
    den: u64,
    /// How long a refusal keeps the key refused, in microseconds (0: no
    /// lock-out). See [`Quota::lockout`].
    lockout_us: u64,
}

impl Quota {
    /// `tokens` refilled per `period`, with a capacity of `tokens`.
    ///
    /// The period must lie between [`MIN_PERIOD`] and [`MAX_PERIOD`] and be a whole
    /// number of microseconds; `tokens` must not be zero; and the bucket must stay
    /// exact (capacity x period-in-microseconds / gcd below 2^52).
    pub fn new(tokens: u64, period: Duration) -> Result<Self, ConfigError> {
        if tokens == 0 {
            return Err(ConfigError::quota("tokens per period must be at least 1"));
        }
        if period < MIN_PERIOD || period > MAX_PERIOD {
            return Err(ConfigError::quota(format!(
                "period {period:?} is outside {MIN_PERIOD:?}..={MAX_PERIOD:?}"
            )));
        }
        if !period.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConfigError::quota(format!(
                "period {period:?} is not a whole number of microseconds"
            )));
        }
        // MAX_PERIOD bounds this well inside u64.
        let period_us = period.as_micros() as u64;
        let g = gcd(tokens, period_us);
        Self::checked(tokens, period_us, tokens, tokens / g, period_us / g)
    }

    /// [`Quota::new`] for a constant: `tokens` per `period_us` microseconds
    /// with a bucket of `capacity`, checked as `new` and
    /// [`burst`](Self::burst) check it, panicking where they would return
    /// an error. Evaluated in a `const` (as [`quota!`](crate::quota!) does),
    /// a mistake fails the build. For figures known only at run time, use
    /// `new` and `burst`, which return the error.
    ///
    /// # Panics
    ///
    /// When `tokens` or `capacity` is 0, the period is outside
    /// [`MIN_PERIOD`]`..=`[`MAX_PERIOD`], or the bucket cannot be counted
    /// exactly.
    pub const fn constant(tokens: u64, period_us: u64, capacity: u64) -> Self {
        assert!(tokens > 0, "a quota refills at least 1 token per period");
        assert!(capacity > 0, "a quota's burst capacity is at least 1");
        assert!(
            period_us >= MIN_PERIOD.as_micros() as u64
                && period_us <= MAX_PERIOD.as_micros() as u64,
            "a quota's period is between 1 ms and 366 days"
        );
        let g = gcd(tokens, period_us);
        let (num, den) = (tokens / g, period_us / g);
        assert!(
            capacity <= MAX_EXACT / den && num <= MAX_EXACT,
            "this quota is too large to count exactly: use a smaller capacity or \
             a rate that divides the period more evenly"
        );
        Quota {
            tokens,
            period_us,
            capacity,
            num,
            den,
            lockout_us: 0,
        }
    }

    /// `n` tokens refilled per second, capacity `n`.
    pub fn per_second(n: u64) -> Result<Self, ConfigError> {
        Self::new(n, Duration::from_secs(1))
    }

    /// `n` tokens refilled per minute, capacity `n`.
    pub fn per_minute(n: u64) -> Result<Self, ConfigError> {
        Self::new(n, Duration::from_secs(60))
    }

    /// `n` tokens refilled per hour, capacity `n`.
    pub fn per_hour(n: u64) -> Result<Self, ConfigError> {
        Self::new(n, Duration::from_secs(3600))
    }

    /// The same rate with a bucket of `capacity` tokens: the largest burst admitted
    /// at once, and the largest cost a single check may ask for.
    pub fn burst(self, capacity: u64) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::quota("burst capacity must be at least 1"));
        }
        Self::checked(self.tokens, self.period_us, capacity, self.num, self.den)?
            .with_lockout(self.lockout_us)
    }

    /// The same quota with a lock-out: once a check of a key is refused by
    /// this quota, the key stays refused for `time` from that refusal, and
    /// then holds exactly the refused check's cost, refilling at the quota's
    /// rate from there (it does not start full: a client that is refused
    /// again at once is locked out again). `Duration::ZERO` removes the
    /// lock-out.
    ///
    /// A refusal during a lock-out does not extend it: its end is fixed by
    /// the refusal that began it. `Retry-After`, the `RateLimit` headers and
    /// gRPC's `RetryInfo` tell its end. (A deny cache does not answer for a
    /// locked-out key: whether a refusal after the end locks again depends on
    /// what a decision does not tell, so every check of it asks the store.) The lock-out is part of the
    /// bucket (stamped with the lock-out's end, it refills nothing before
    /// it), so in Redis every instance sharing the key sees it at once; a policy with a lock-out quota takes
    /// no leases (a hold's tokens would stay spendable by its holder), and
    /// the fallback locks out per instance. This is the one case where a
    /// refused check changes the bucket. In delay mode, a request that may
    /// wait that long waits for the lock-out's end instead of being refused.
    ///
    /// The time must be a whole number of microseconds and at most
    /// [`MAX_PERIOD`]. In the text form: `5/15min lockout 15min`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Quota;
    ///
    /// # fn main() -> Result<(), tollgate::ConfigError> {
    /// // 5 attempts, then 15 minutes locked out.
    /// let login = Quota::new(5, Duration::from_secs(900))?.lockout(Duration::from_secs(900))?;
    /// assert_eq!(login, "5/15min lockout 15min".parse()?);
    /// assert_eq!(login.lockout_time(), Some(Duration::from_secs(900)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn lockout(self, time: Duration) -> Result<Self, ConfigError> {
        if time > MAX_PERIOD {
            return Err(ConfigError::quota(format!(
                "lock-out {time:?} is longer than {MAX_PERIOD:?}"
            )));
        }
        if !time.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConfigError::quota(format!(
                "lock-out {time:?} is not a whole number of microseconds"
            )));
        }
        // MAX_PERIOD bounds this well inside u64.
        self.with_lockout(time.as_micros() as u64)
    }

    fn with_lockout(mut self, lockout_us: u64) -> Result<Self, ConfigError> {
        let units = u128::from(lockout_us) * u128::from(self.num);
        if units + u128::from(self.full()) > u128::from(MAX_EXACT) {
            return Err(ConfigError::quota(format!(
                "a lock-out of {:?} is too long to count exactly at {} per {:?}; \
                 use a shorter lock-out or a smaller capacity",
                Duration::from_micros(lockout_us),
                self.tokens,
                Duration::from_micros(self.period_us)
            )));
        }
        self.lockout_us = lockout_us;
        Ok(self)
    }

    /// How long a refusal keeps a key refused ([`lockout`](Self::lockout)),
    /// or `None` without a lock-out.
    pub fn lockout_time(&self) -> Option<Duration> {
        (self.lockout_us > 0).then(|| Duration::from_micros(self.lockout_us))
    }

    /// Whether `other` counts the same way: the same rate and burst,
    /// whatever their lock-outs (a bucket kept under one needs no carrying
    /// over into the other).
    #[inline]
    pub(crate) fn same_bucket(&self, other: &Quota) -> bool {
        (self.tokens, self.period_us, self.capacity)
            == (other.tokens, other.period_us, other.capacity)
    }

    /// Whether `other` has the same period, and so the same buckets: a
    /// policy's quotas are told apart by their periods, and a bucket kept
    /// under one quota is carried into another of its period
    /// ([`Level::carried`](crate::store::bucket::Level::carried)).
    pub(crate) fn same_period(&self, other: &Quota) -> bool {
        self.period_us == other.period_us
    }

    /// The lock-out in microseconds (0: none).
    #[inline]
    pub(crate) fn lockout_us(&self) -> u64 {
        self.lockout_us
    }

    /// The lock-out in level units: the refill of its time (0: none).
    #[inline]
    pub(crate) fn lockout_units(&self) -> u64 {
        self.lockout_us * self.num
    }

    fn checked(
        tokens: u64,
        period_us: u64,
        capacity: u64,
        num: u64,
        den: u64,
    ) -> Result<Self, ConfigError> {
        let full = capacity.checked_mul(den).filter(|f| *f <= MAX_EXACT);
        if full.is_none() || num > MAX_EXACT {
            return Err(ConfigError::quota(format!(
                "{tokens} per {:?} with capacity {capacity} is too large to count exactly; \
                 use a smaller capacity or a rate that divides the period more evenly",
                Duration::from_micros(period_us)
            )));
        }
        Ok(Quota {
            tokens,
            period_us,
            capacity,
            num,
            den,
            lockout_us: 0,
        })
    }

    /// The bucket capacity: the most tokens it holds, and the `limit` reported.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Tokens refilled per [`period`](Self::period).
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The refill period.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// Time for an empty bucket to refill completely.
    pub fn refill_time(&self) -> Duration {
        Duration::from_micros(ceil_div(self.full(), self.num))
    }

    /// Refill per microsecond, numerator of the reduced fraction.
    pub(crate) fn num(&self) -> u64 {
        self.num
    }

    /// Refill per microsecond, denominator: one token is `den` units of level.
    pub(crate) fn den(&self) -> u64 {
        self.den
    }

    /// A full bucket, in units of `1 / den` token.
    pub(crate) fn full(&self) -> u64 {
        self.capacity * self.den
    }

    /// The end of its buckets' storage keys, its period (`1s`, `15m`): the
    /// quotas of one policy have distinct periods, and a quota changed to
    /// other figures of the same period finds the same buckets and carries
    /// what they hold into its own figures.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn slot(&self) -> QuotaSlot {
        QuotaSlot(self.period_us)
    }

    /// The end of its buckets' storage keys in a policy that does not carry
    /// buckets over (an unnamed one, see `Policy::carries`): its figures,
    /// `10/s:b20`, so that quotas of other figures never share a bucket (and
    /// not `10/1s:20`, the keys of builds whose values held no figures).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn figures(&self) -> QuotaFigures {
        QuotaFigures(*self)
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quota({self})")
    }
}

/// [`Quota::slot`]: a period, as storage keys name it.
pub(crate) struct QuotaSlot(u64);

impl fmt::Display for QuotaSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        PeriodName(self.0).fmt(f)
    }
}

/// [`Quota::figures`]: rate and burst, as storage keys name them.
pub(crate) struct QuotaFigures(Quota);

impl fmt::Display for QuotaFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = &self.0;
        // `10/s:b20`: a period of one unit without its 1, as the text form
        // writes it (and keys as long as the earlier `10/1s:20`).
        let period = PeriodName(q.period_us).to_string();
        let period = match period.strip_prefix('1') {
            Some(unit) if unit.starts_with(|c: char| c.is_ascii_alphabetic()) => unit,
            _ => &period,
        };
        write!(f, "{}/{period}:b{}", q.tokens, q.capacity)
    }
}

/// A period in the largest unit that divides it: `1s`, `15m`, `2h`, `1500ms`.
struct PeriodName(u64);

impl fmt::Display for PeriodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 5] = [
            (86_400_000_000, "d"),
            (3_600_000_000, "h"),
            (60_000_000, "m"),
            (1_000_000, "s"),
            (1_000, "ms"),
        ];
        for (size, unit) in UNITS {
            if self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}us", self.0)
    }
}

pub(crate) const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `ceil(a / b)` for `b > 0`.
/// A duration in whole microseconds, saturating at `u64::MAX`.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[inline]
pub(crate) fn ceil_div(a: u64, b: u64) -> u64 {
    // Most quotas refill a whole number of microseconds per token (`num`
    // is 1): no division then, the slowest instruction of a check.
    if b <= 1 { a } else { a.div_ceil(b) }
}

/// A constant [`Quota`], checked when the program is built: no `?`.
///
/// `quota!(N per second)`, `per minute`, `per hour`, `per day`, or
/// `per S seconds`; then, optionally, `, burst B` for a bucket of `B`
/// tokens (the capacity is `N` without it). A quota that [`Quota::new`]
/// would refuse (0 tokens, a bucket too large to count exactly) does not
/// compile. The figures must be constants.
///
/// ```
/// use tollgate::{Policy, Quota, quota};
///
/// const API: Quota = quota!(10 per second, burst 20);
/// let policy = Policy::new("api", [API, quota!(1000 per hour)]).unwrap();
/// assert_eq!(API, Quota::per_second(10).unwrap().burst(20).unwrap());
/// # let _ = policy;
/// ```
///
/// ```compile_fail
/// const NONE: tollgate::Quota = tollgate::quota!(0 per second);
/// ```
#[macro_export]
macro_rules! quota {
    ($n:literal per second $(, burst $b:expr)?) => {
        $crate::quota!(@ $n, 1_000_000u64 $(, $b)?)
    };
    ($n:literal per minute $(, burst $b:expr)?) => {
        $crate::quota!(@ $n, 60_000_000u64 $(, $b)?)
    };
    ($n:literal per hour $(, burst $b:expr)?) => {
        $crate::quota!(@ $n, 3_600_000_000u64 $(, $b)?)
    };
    ($n:literal per day $(, burst $b:expr)?) => {
        $crate::quota!(@ $n, 86_400_000_000u64 $(, $b)?)
    };
    ($n:literal per $s:literal seconds $(, burst $b:expr)?) => {
        $crate::quota!(@ $n, ($s as u64) * 1_000_000u64 $(, $b)?)
    };
    (@ $n:expr, $us:expr) => {
        const { $crate::Quota::constant($n, $us, $n) }
    };
    (@ $n:expr, $us:expr, $b:expr) => {
        const { $crate::Quota::constant($n, $us, $b) }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_quotas_are_the_checked_ones() {
        assert_eq!(quota!(10 per second), Quota::per_second(10).unwrap());
        assert_eq!(
            quota!(10 per second, burst 20),
            Quota::per_second(10).unwrap().burst(20).unwrap()
        );
        assert_eq!(quota!(7 per minute), Quota::per_minute(7).unwrap());
        assert_eq!(quota!(1000 per hour), Quota::per_hour(1000).unwrap());
        assert_eq!(
            quota!(5 per 900 seconds, burst 5),
            Quota::new(5, Duration::from_secs(900)).unwrap()
        );
        assert_eq!(
            quota!(3 per day),
            Quota::new(3, Duration::from_secs(86_400)).unwrap()
        );
        // Past the exact range, as `burst` refuses it.
        let too_large = std::panic::catch_unwind(|| Quota::constant(7, 1_000_000, u64::MAX / 2));
        assert!(too_large.is_err());
        assert!(Quota::per_second(7).unwrap().burst(u64::MAX / 2).is_err());
    }

    #[test]
    fn per_period_means_n_tokens_per_period() {
        let q = Quota::per_minute(60).unwrap();
        assert_eq!(q.capacity(), 60);
        assert_eq!(q.refill_time(), Duration::from_secs(60));
        let q = Quota::per_hour(1).unwrap();
        assert_eq!(q.refill_time(), Duration::from_secs(3600));
        let q = Quota::per_second(7).unwrap().burst(14).unwrap();
        assert_eq!(q.refill_time(), Duration::from_secs(2));
        assert_eq!((q.num(), q.den()), (7, 1_000_000));
    }

    #[test]
    fn zero_and_absurd_values_are_rejected() {
        assert!(Quota::per_second(0).is_err());
        assert!(Quota::per_second(1).unwrap().burst(0).is_err());
        assert!(Quota::new(1, Duration::ZERO).is_err());
        assert!(Quota::new(1, Duration::from_nanos(1_500_001)).is_err());
        assert!(Quota::new(1, MAX_PERIOD + Duration::from_secs(1)).is_err());
        // One token per (prime) microsecond count with a huge burst cannot stay exact.
        let err = Quota::new(1, Duration::from_micros(86_399_999))
            .unwrap()
            .burst(1 << 40)
            .unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        assert!(Quota::per_second(u64::MAX).is_err());
    }

    #[test]
    fn figures_name_the_whole_quota() {
        let a = Quota::per_second(10).unwrap();
        assert_eq!(a.figures().to_string(), "10/s:b10");
        assert_eq!(a.burst(20).unwrap().figures().to_string(), "10/s:b20");
        let odd = Quota::new(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(odd.figures().to_string(), "3/1500ms:b3");
        let quarter = Quota::new(2, Duration::from_secs(15 * 60)).unwrap();
        assert_eq!(quarter.figures().to_string(), "2/15m:b2");
    }

    #[test]
    fn slots_name_the_period_alone() {
        let a = Quota::per_second(10).unwrap();
        assert_eq!(a.slot().to_string(), "1s");
        assert_eq!(a.burst(20).unwrap().slot().to_string(), "1s");
        assert_eq!(Quota::per_minute(5).unwrap().slot().to_string(), "1m");
        assert_eq!(
            Quota::new(3, Duration::from_millis(1500))
                .unwrap()
                .slot()
                .to_string(),
            "1500ms"
        );
        // Storage keys keep their own form: changing how quotas are written
        // must not start fresh buckets.
        assert_eq!(a.to_string(), "10/s");
    }
}
