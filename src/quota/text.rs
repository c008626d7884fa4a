//! A quota's text form, as written in configuration files: `10/s`, `100/min`,
//! `5000/h`, `1/day`, `10/s burst 50`, `3/1500ms`, `5/15min lockout 15min`.
//! `Display` writes it and
//! `FromStr` reads it back; see [`Quota`]'s docs for the grammar.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::Quota;
use crate::error::ConfigError;
/// Units a period may be written in: each spelling and its length in
/// microseconds. Matched without regard to ASCII case.
const UNITS: [(&[&str], u64); 7] = [
    (&["us", "µs", "usec", "microsecond", "microseconds"], 1),
    (&["ms", "msec", "millisecond", "milliseconds"], 1_000),
    (&["s", "sec", "secs", "second", "seconds"], 1_000_000),
    (&["m", "min", "mins", "minute", "minutes"], 60_000_000),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600_000_000),
    (&["d", "day", "days"], 86_400_000_000),
    (&["w", "week", "weeks"], 604_800_000_000),
];

/// The units `Display` writes, largest first: the largest that divides the
/// period, so `60s` is `min` and `1500ms` stays `1500ms`.
const WRITTEN: [(u64, &str); 6] = [
    (86_400_000_000, "d"),
    (3_600_000_000, "h"),
    (60_000_000, "min"),
    (1_000_000, "s"),
    (1_000, "ms"),
    (1, "us"),
];

/// The longest text an error message quotes; configuration values are not
/// secret, but a message should stay a line.
const QUOTED: usize = 80;

const EXPECTED: &str = "expected <tokens>/<period> [burst <capacity>] [lockout <time>], such as \"10/s\", \"100/min\" or \"10/s burst 50\"";

/// The period part of the text form: `s`, `min`, `15min`, `1500ms`.
pub(super) struct WrittenPeriod(pub(super) u64);

impl fmt::Display for WrittenPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (size, unit) = WRITTEN
            .iter()
            .copied()
            .find(|(size, _)| self.0.is_multiple_of(*size))
            .unwrap_or((1, "us"));
        match self.0 / size {
            1 => f.write_str(unit),
            count => write!(f, "{count}{unit}"),
        }
    }
}

impl fmt::Display for Quota {
    /// The text form, which [`FromStr`] reads back to the same quota:
    /// `10/s`, `100/min`, `3/1500ms`, `10/s burst 50` (the burst only when it
    /// differs from the tokens per period).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tokens, WrittenPeriod(self.period_us))?;
        if self.capacity != self.tokens {
            write!(f, " burst {}", self.capacity)?;
        }
        if self.lockout_us > 0 {
            let written = WrittenPeriod(self.lockout_us).to_string();
            // Always with its count: `lockout 1s`, not `lockout s`.
            match written.starts_with(|c: char| c.is_ascii_digit()) {
                true => write!(f, " lockout {written}")?,
                false => write!(f, " lockout 1{written}")?,
            }
        }
        Ok(())
    }
}

impl FromStr for Quota {
    type Err = ConfigError;

    /// Reads the text form (see [`Quota`] for the grammar). Mistakes are the
    /// constructors' [`ConfigError`]s, naming the text:
    /// `invalid quota: "0/s": tokens per period must be at least 1`.
    fn from_str(text: &str) -> Result<Self, ConfigError> {
        parse(text).map_err(|e| e.about(Quoted(text)))
    }
}

/// `text` in quotes, shortened to [`QUOTED`] characters.
struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(QUOTED) {
            Some((end, _)) => write!(f, "{:?}...", self.0.get(..end).unwrap_or("")),
            None => write!(f, "{:?}", self.0),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'a> {
    Number(&'a str),
    Word(&'a str),
    Slash,
    Comma,
}

/// Splits `text` into numbers, words, `/` and `,`; whitespace separates.
fn tokens(text: &str) -> Result<Vec<Token<'_>>, ConfigError> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let run = |keep: fn(char) -> bool| rest.find(|c: char| !keep(c)).unwrap_or(rest.len());
        let len = if c.is_whitespace() {
            run(char::is_whitespace)
        } else if c.is_ascii_digit() {
            let len = run(|c| c.is_ascii_digit());
            out.push(Token::Number(rest.get(..len).unwrap_or("")));
            len
        } else if c.is_alphabetic() {
            let len = run(char::is_alphabetic);
            out.push(Token::Word(rest.get(..len).unwrap_or("")));
            len
        } else if c == '/' || c == ',' {
            out.push(if c == '/' { Token::Slash } else { Token::Comma });
            1
        } else {
            return Err(ConfigError::quota(format!(
                "unexpected character {c:?}; {EXPECTED}"
            )));
        };
        rest = rest.get(len..).unwrap_or("");
    }
    Ok(out)
}

fn number(digits: &str) -> Result<u64, ConfigError> {
    digits.parse().map_err(|_| {
        ConfigError::quota(format!("{} is too large to count exactly", Quoted(digits)))
    })
}

fn unit(word: &str) -> Result<u64, ConfigError> {
    UNITS
        .iter()
        .find(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(word)))
        .map(|(_, us)| *us)
        .ok_or_else(|| {
            ConfigError::quota(format!(
                "unknown unit {}; use us, ms, s, min, h, d or w (or their names)",
                Quoted(word)
            ))
        })
}

fn is_word(token: Option<&Token<'_>>, word: &str) -> bool {
    matches!(token, Some(Token::Word(w)) if w.eq_ignore_ascii_case(word))
}

/// A time written `[<count>] <unit>` (the period, the lock-out), in
/// microseconds; `what` names it in the error of one past `u64`.
fn span<'a>(
    at: &mut std::iter::Peekable<std::slice::Iter<'a, Token<'a>>>,
    what: &str,
) -> Result<u64, ConfigError> {
    let count = match at.peek() {
        Some(Token::Number(c)) => {
            at.next();
            number(c)?
        }
        _ => 1,
    };
    let Some(Token::Word(u)) = at.next() else {
        return Err(ConfigError::quota(EXPECTED));
    };
    count.checked_mul(unit(u)?).ok_or_else(|| {
        ConfigError::quota(format!(
            "{what} {count}{u} is longer than {:?}",
            super::MAX_PERIOD
        ))
    })
}

fn parse(text: &str) -> Result<Quota, ConfigError> {
    let tokens = tokens(text)?;
    let mut at = tokens.iter().peekable();
    let expected = || ConfigError::quota(EXPECTED);
    let Some(Token::Number(n)) = at.next() else {
        return Err(expected());
    };
    let per_word = is_word(at.peek().copied(), "per");
    match at.next() {
        Some(Token::Slash) => {}
        Some(Token::Word(_)) if per_word => {}
        _ => return Err(expected()),
    }
    let period_us = span(&mut at, "period")?;
    let quota = Quota::new(number(n)?, Duration::from_micros(period_us))?;
    if at.peek() == Some(&&Token::Comma) {
        at.next();
    }
    let mut quota = quota;
    if is_word(at.peek().copied(), "burst") {
        at.next();
        match at.next() {
            Some(Token::Number(b)) => quota = quota.burst(number(b)?)?,
            _ => return Err(expected()),
        }
        if at.peek() == Some(&&Token::Comma) {
            at.next();
        }
    }
    if is_word(at.peek().copied(), "lockout") {
        at.next();
        let lockout_us = span(&mut at, "lock-out")?;
        quota = quota.lockout(Duration::from_micros(lockout_us))?;
    }
    match at.next() {
        None => Ok(quota),
        Some(_) => Err(expected()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quota {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} did not parse: {e}"))
    }

    fn err(text: &str) -> String {
        match text.parse::<Quota>() {
            Ok(quota) => panic!("{text:?} parsed as {quota}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_lockout_reads_and_writes_back() {
        let base = Quota::new(5, Duration::from_secs(900)).unwrap();
        let login = base.lockout(Duration::from_secs(900)).unwrap();
        assert_eq!(q("5/15min lockout 15min"), login);
        assert_eq!(q("5 per 15 minutes, lockout 900 seconds"), login);
        assert_eq!(login.to_string(), "5/15min lockout 15min");
        let burst = base
            .burst(10)
            .unwrap()
            .lockout(Duration::from_secs(1))
            .unwrap();
        assert_eq!(burst.to_string(), "5/15min burst 10 lockout 1s");
        assert_eq!(q("5/15min burst 10, lockout s"), burst);
        // Without a lock-out, as before; a zero lock-out is none.
        assert_eq!(q("5/15min lockout 0s"), base);
        assert_eq!(base.lockout_time(), None);
        // `burst` keeps the lock-out.
        assert_eq!(
            login.burst(7).unwrap().lockout_time(),
            Some(Duration::from_secs(900))
        );
    }

    #[test]
    fn the_usual_forms_equal_the_constructors() {
        assert_eq!(q("100/min"), Quota::per_minute(100).unwrap());
        assert_eq!(q("10/s"), Quota::per_second(10).unwrap());
        assert_eq!(q("5000/h"), Quota::per_hour(5000).unwrap());
        let day = Quota::new(1, Duration::from_secs(86_400)).unwrap();
        assert_eq!(q("1/day"), day);
        assert_eq!(q("1/d"), day);
        assert_eq!(q("1/24h"), day);
        let burst = Quota::per_second(10).unwrap().burst(50).unwrap();
        assert_eq!(q("10/s burst 50"), burst);
        assert_eq!(q("10/s, burst 50"), burst);
        assert_eq!(q("  10 / s   BURST 50 "), burst);
        assert_eq!(q("10 per second burst 50"), burst);
        assert_eq!(q("10/1s"), Quota::per_second(10).unwrap());
        assert_eq!(
            q("3/1500ms"),
            Quota::new(3, Duration::from_millis(1500)).unwrap()
        );
        assert_eq!(
            q("2/15 minutes"),
            Quota::new(2, Duration::from_secs(900)).unwrap()
        );
        assert_eq!(
            q("7/w"),
            Quota::new(7, Duration::from_secs(604_800)).unwrap()
        );
        assert_eq!(
            q("3/1500µs"),
            Quota::new(3, Duration::from_micros(1500)).unwrap()
        );
    }

    #[test]
    fn display_writes_the_text_form() {
        for (quota, text) in [
            (Quota::per_second(10).unwrap(), "10/s"),
            (Quota::per_minute(100).unwrap(), "100/min"),
            (Quota::per_hour(5000).unwrap(), "5000/h"),
            (Quota::new(1, Duration::from_secs(86_400)).unwrap(), "1/d"),
            (
                Quota::new(1, Duration::from_secs(7 * 86_400)).unwrap(),
                "1/7d",
            ),
            (
                Quota::per_second(10).unwrap().burst(50).unwrap(),
                "10/s burst 50",
            ),
            (
                Quota::new(3, Duration::from_millis(1500)).unwrap(),
                "3/1500ms",
            ),
            (Quota::new(2, Duration::from_secs(900)).unwrap(), "2/15min"),
            (
                Quota::new(1, Duration::from_micros(86_399_999)).unwrap(),
                "1/86399999us",
            ),
        ] {
            assert_eq!(quota.to_string(), text);
            assert_eq!(q(text), quota);
        }
        // Debug says the same, marked as a quota.
        assert_eq!(format!("{:?}", q("10/s")), "Quota(10/s)");
    }

    #[test]
    fn mistakes_are_the_constructors_errors_naming_the_text() {
        assert_eq!(
            err("0/s"),
            "invalid quota: \"0/s\": tokens per period must be at least 1"
        );
        assert_eq!(
            err("10/s burst 0"),
            "invalid quota: \"10/s burst 0\": burst capacity must be at least 1"
        );
        assert!(
            err("10/0s").contains("\"10/0s\": period 0ns is outside"),
            "{}",
            err("10/0s")
        );
        assert!(err("1/367d").contains("is outside"), "{}", err("1/367d"));
        assert!(err("1/99999999999999999w").contains("longer than"));
        let huge = err("99999999999999999999/s");
        assert!(
            huge.contains("\"99999999999999999999\" is too large"),
            "{huge}"
        );
        assert!(err("18446744073709551615/s").contains("too large to count exactly"));
        assert!(err("10/s burst 99999999999999999").contains("too large to count exactly"));
        for garbage in [
            "",
            "ten/s",
            "10",
            "10/",
            "10 s",
            "/s",
            "10/s/s",
            "10/s burst",
            "10/s 50",
            "10/s burst 5 6",
            "-1/s",
            "1.5/s",
            "10/s;",
        ] {
            let e = err(garbage);
            assert!(e.starts_with("invalid quota: \""), "{garbage:?}: {e}");
            assert!(
                e.contains("expected") || e.contains("unexpected"),
                "{garbage:?}: {e}"
            );
        }
        assert!(err("10/fortnight").contains("unknown unit \"fortnight\""));
        for garbage in ["10/s lockout", "10/s lockout 5", "10/s lockout 5m burst 3"] {
            let e = err(garbage);
            assert!(e.contains("expected"), "{garbage:?}: {e}");
        }
        assert!(err("10/s lockout 367d").contains("longer than"));
        // Long text is quoted shortened.
        let long = format!("10/{}", "x".repeat(10_000));
        assert!(err(&long).len() < 400);
    }

    proptest::proptest! {
        #[test]
        fn display_then_from_str_gives_the_same_quota(
            tokens in 1u64..2_000_000,
            period_us in prop_period(),
            burst in proptest::option::of(1u64..4_000_000),
            lockout_us in proptest::option::of(1u64..40_000_000_000),
        ) {
            let Ok(base) = Quota::new(tokens, Duration::from_micros(period_us)) else {
                return Ok(());
            };
            let quota = match burst.map(|b| base.burst(b)) {
                Some(Ok(q)) => q,
                Some(Err(_)) => return Ok(()),
                None => base,
            };
            let quota = match lockout_us.map(|us| quota.lockout(Duration::from_micros(us))) {
                Some(Ok(q)) => q,
                Some(Err(_)) => return Ok(()),
                None => quota,
            };
            let text = quota.to_string();
            proptest::prop_assert_eq!(text.parse::<Quota>().ok(), Some(quota), "{}", text);
        }

        #[test]
        fn any_text_parses_or_names_itself_without_panicking(text in "[0-9a-zµ/, .;-]{0,40}") {
            match text.parse::<Quota>() {
                Ok(quota) => {
                    let again: Quota = quota.to_string().parse().unwrap();
                    proptest::prop_assert_eq!(again, quota);
                }
                Err(e) => proptest::prop_assert!(e.to_string().starts_with("invalid quota: \"")),
            }
        }
    }

    fn prop_period() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            Just(1_000_000u64),
            Just(60_000_000),
            Just(3_600_000_000),
            Just(86_400_000_000),
            (1u64..=366).prop_map(|d| d * 86_400_000_000),
            (1u64..=1000).prop_map(|m| m * 60_000_000),
            1_000u64..=10_000_000,
            1_000u64..=super::super::MAX_PERIOD.as_micros() as u64,
        ]
    }
}
