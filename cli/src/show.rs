//! How figures are written: durations for people and for JSON.

use std::time::Duration;

/// A duration as a person reads it, rounded up to the millisecond (a wait
/// shown is always long enough): `0s`, `350ms`, `1.25s`, `2m 5s`, `3h 20m`,
/// `2d 4h`.
pub(crate) fn human(d: Duration) -> String {
    let ms = millis(d);
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        let text = format!("{:.3}", ms as f64 / 1_000.0);
        return format!("{}s", text.trim_end_matches('0').trim_end_matches('.'));
    }
    let s = ms.div_ceil(1_000);
    let (big, small, names) = match s {
        ..3_600 => (s / 60, s % 60, ("m", "s")),
        3_600..86_400 => (s / 3_600, s % 3_600 / 60, ("h", "m")),
        _ => (s / 86_400, s % 86_400 / 3_600, ("d", "h")),
    };
    if small == 0 {
        format!("{big}{}", names.0)
    } else {
        format!("{big}{} {small}{}", names.0, names.1)
    }
}

/// Whole milliseconds, rounded up: the figure JSON gives (`*_ms`).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// `500ms`, `2s`, `1m`, or a number of seconds, for `--timeout`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (500ms, 2s, 1m)"))?;
    match unit.trim() {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" | "min" => Ok(Duration::from_secs(n.saturating_mul(60))),
        other => Err(format!(
            "unknown unit {other:?} in {text:?}: use ms, s or m"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_micros(1), "1ms"),
            (Duration::from_millis(350), "350ms"),
            (Duration::from_millis(1_250), "1.25s"),
            (Duration::from_secs(2), "2s"),
            (Duration::from_secs(125), "2m 5s"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(12_000), "3h 20m"),
            (Duration::from_secs(187_200), "2d 4h"),
        ];
        for (d, text) in cases {
            assert_eq!(human(d), text, "{d:?}");
        }
        assert_eq!(millis(Duration::from_micros(1_001)), 2);
    }

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("2h").is_err());
    }
}
