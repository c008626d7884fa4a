//! A quota in configuration files (cargo feature `serde`): its text form,
//! `"10/s"` or `"100/min burst 150"`, both ways.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

use super::Quota;

impl Serialize for Quota {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quota {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(QuotaText)
    }
}

struct QuotaText;

impl Visitor<'_> for QuotaText {
    type Value = Quota;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a quota such as \"10/s\", \"100/min\" or \"10/s burst 50\"")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Quota, E> {
        text.parse().map_err(E::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Deserialize, serde::Serialize)]
    struct Limits {
        api: Quota,
        daily: Vec<Quota>,
    }

    #[test]
    fn quotas_are_text_in_configuration_files() {
        let limits: Limits =
            toml::from_str("api = \"10/s burst 20\"\ndaily = [\"1000/day\", \"5/min\"]\n").unwrap();
        assert_eq!(
            limits.api,
            Quota::per_second(10).unwrap().burst(20).unwrap()
        );
        assert_eq!(limits.daily[1], Quota::per_minute(5).unwrap());
        let written = toml::to_string(&limits).unwrap();
        assert_eq!(
            written,
            "api = \"10/s burst 20\"\ndaily = [\"1000/d\", \"5/min\"]\n"
        );
        assert_eq!(toml::from_str::<Limits>(&written).unwrap(), limits);
    }

    #[test]
    fn a_bad_quota_names_its_text_and_place() {
        let err = toml::from_str::<Limits>("api = \"10/s\"\ndaily = [\"0/day\"]\n").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("invalid quota: \"0/day\": tokens per period must be at least 1"),
            "{text}"
        );
        // toml points at the entry.
        assert!(text.contains("line 2"), "{text}");
        let err = toml::from_str::<Limits>("api = 10\ndaily = []\n").unwrap_err();
        assert!(err.to_string().contains("a quota such as"), "{err}");
    }
}
