//! Policy tables in configuration files (cargo feature `serde`): a
//! [`PolicyTable`] is a list of entries, each a [`PolicyRule`] written as
//!
//! ```toml
//! [[policy]]
//! name = "login"
//! quotas = ["5/min", "20/h"]
//! routes = ["POST /login"]
//! key = { kind = "client_ip", trusted_proxies = ["10.0.0.0/8"] }
//! ```
//!
//! Every entry is checked as it is read, and a mistake names the entry (its
//! policy name) and the value, on top of the position the format reports.

use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, Serializer};

use super::rule::PolicyRule;
use super::rule_key::{ClientIpFrom, KeySpec, RuleKey};
use super::table::PolicyTable;
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::quota::Quota;
/// One entry as written.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    /// Quotas in their text form; parsed here, so an error can name the entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    quotas: Vec<String>,
    /// Read as written and built here, so an error can name the entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<KeyField>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    grpc: Vec<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    exempt: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl TryFrom<Entry> for PolicyRule {
    type Error = ConfigError;

    fn try_from(entry: Entry) -> Result<Self, ConfigError> {
        let name = entry.name;
        let about = |e: ConfigError| e.about(format_args!("policy {name:?}"));
        let rule = if entry.exempt {
            if !entry.quotas.is_empty() || entry.key.is_some() {
                return Err(ConfigError::policy(format!(
                    "policy {name:?} is exempt: it takes no quotas and no key"
                )));
            }
            PolicyRule::exempt(&name)?
        } else {
            let quotas = entry
                .quotas
                .iter()
                .map(|q| q.parse::<Quota>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(about)?;
            if quotas.is_empty() {
                return Err(ConfigError::policy(format!(
                    "policy {name:?} needs at least one quota (quotas = [\"10/s\"]), or \
                     exempt = true"
                )));
            }
            let rule = PolicyRule::new(Policy::new(&name, quotas)?);
            match entry.key {
                Some(KeyField(table)) => {
                    let key = table.spec().and_then(RuleKey::from_spec).map_err(about)?;
                    rule.key(key)
                }
                None => rule,
            }
        };
        rule.routes(&entry.routes)
            .and_then(|rule| rule.grpc(&entry.grpc))
            .map_err(about)
    }
}

impl From<&PolicyRule> for Entry {
    fn from(rule: &PolicyRule) -> Self {
        Entry {
            name: rule.name().to_owned(),
            quotas: rule
                .policy()
                .map(|p| p.quotas().iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            key: rule.rule_key().map(|k| KeyField(KeyTable::from(k.spec()))),
            routes: rule.route_texts().collect(),
            grpc: rule.grpc_texts().collect(),
            exempt: rule.is_exempt(),
        }
    }
}

impl Serialize for PolicyRule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        Entry::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PolicyRule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entry = Entry::deserialize(deserializer)?;
        PolicyRule::try_from(entry).map_err(de::Error::custom)
    }
}

impl Serialize for PolicyTable {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.rules().iter())
    }
}

impl<'de> Deserialize<'de> for PolicyTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let rules = Vec::<PolicyRule>::deserialize(deserializer)?;
        PolicyTable::new(rules).map_err(de::Error::custom)
    }
}

/// A key as a table: `kind` and the options of that kind.
#[derive(Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct KeyTable {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trusted_proxies: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hops: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    only_from: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "is_false")]
    forwarded: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ipv6_prefix: Option<u8>,
}

impl KeyTable {
    /// The options given, by name, for "takes no ..." messages.
    fn given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        for (set, field) in [
            (self.name.is_some(), "name"),
            (self.trusted_proxies.is_some(), "trusted_proxies"),
            (self.hops.is_some(), "hops"),
            (self.header.is_some(), "header"),
            (self.only_from.is_some(), "only_from"),
            (self.forwarded, "forwarded"),
            (self.ipv6_prefix.is_some(), "ipv6_prefix"),
        ] {
            if set {
                given.push(field);
            }
        }
        given
    }

    fn allow_only(&self, allowed: &[&str]) -> Result<(), ConfigError> {
        match self.given().into_iter().find(|f| !allowed.contains(f)) {
            Some(field) => Err(ConfigError::key(format!(
                "a key of kind {:?} takes no `{field}`",
                self.kind
            ))),
            None => Ok(()),
        }
    }

    fn spec(self) -> Result<KeySpec, ConfigError> {
        match self.kind.as_str() {
            "peer_ip" => {
                self.allow_only(&["ipv6_prefix"])?;
                Ok(KeySpec::PeerIp {
                    ipv6_prefix: self.ipv6_prefix,
                })
            }
            "global" | "route" => {
                self.allow_only(&[])?;
                Ok(if self.kind == "global" {
                    KeySpec::Global
                } else {
                    KeySpec::Route
                })
            }
            "header" => {
                self.allow_only(&["name"])?;
                let name = self.name.ok_or_else(|| {
                    ConfigError::key("a key of kind \"header\" needs the header's `name`")
                })?;
                Ok(KeySpec::Header { name })
            }
            "client_ip" => self.client_ip(),
            other => Err(ConfigError::key(format!(
                "unknown key kind {:?}: use peer_ip, client_ip, header, global or route",
                other.chars().take(40).collect::<String>()
            ))),
        }
    }

    /// A client behind proxies: exactly one source, and always the networks
    /// whose headers are believed.
    fn client_ip(self) -> Result<KeySpec, ConfigError> {
        let (from, trusted) = match (self.trusted_proxies, self.hops, self.header) {
            (Some(trusted), None, None) => {
                if self.only_from.is_some() {
                    return Err(ConfigError::key(
                        "a client_ip key with `trusted_proxies` lists every trusted network \
                         there; `only_from` goes with `hops` or `header`",
                    ));
                }
                (ClientIpFrom::TrustedProxies, trusted)
            }
            (None, Some(count), None) => (ClientIpFrom::Hops(count), only_from(self.only_from)?),
            (None, None, Some(name)) => (ClientIpFrom::Header(name), only_from(self.only_from)?),
            _ => {
                return Err(ConfigError::key(
                    "a client_ip key takes one of `trusted_proxies`, `hops` (with \
                     `only_from`) or `header` (with `only_from`)",
                ));
            }
        };
        Ok(KeySpec::ClientIp {
            from,
            trusted,
            forwarded: self.forwarded,
            ipv6_prefix: self.ipv6_prefix,
        })
    }
}

/// `only_from` is required: a file cannot ask to believe any peer.
fn only_from(networks: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    networks.ok_or_else(|| {
        ConfigError::key(
            "a client_ip key that reads `hops` or a `header` needs `only_from`, the networks \
             of the proxies whose headers it believes (a configuration file cannot trust \
             every peer)",
        )
    })
}

impl From<&KeySpec> for KeyTable {
    fn from(spec: &KeySpec) -> Self {
        let kind = spec.kind_name().to_owned();
        match spec {
            KeySpec::PeerIp { ipv6_prefix } => KeyTable {
                kind,
                ipv6_prefix: *ipv6_prefix,
                ..KeyTable::default()
            },
            KeySpec::ClientIp {
                from,
                trusted,
                forwarded,
                ipv6_prefix,
            } => {
                let mut table = KeyTable {
                    kind,
                    forwarded: *forwarded,
                    ipv6_prefix: *ipv6_prefix,
                    ..KeyTable::default()
                };
                match from {
                    ClientIpFrom::TrustedProxies => table.trusted_proxies = Some(trusted.clone()),
                    ClientIpFrom::Hops(count) => {
                        table.hops = Some(*count);
                        table.only_from = Some(trusted.clone());
                    }
                    ClientIpFrom::Header(name) => {
                        table.header = Some(name.clone());
                        table.only_from = Some(trusted.clone());
                    }
                }
                table
            }
            KeySpec::Header { name } => KeyTable {
                kind,
                name: Some(name.clone()),
                ..KeyTable::default()
            },
            KeySpec::Global | KeySpec::Route => KeyTable {
                kind,
                ..KeyTable::default()
            },
        }
    }
}

/// A key as written: the kind alone (`"peer_ip"`) when it has no options,
/// else a table.
struct KeyField(KeyTable);

impl Serialize for KeyField {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0.given().is_empty() {
            serializer.serialize_str(&self.0.kind)
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for KeyField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KeyText).map(KeyField)
    }
}

impl Serialize for RuleKey {
    /// As in a file: `"peer_ip"`, or `{ kind = "client_ip", ... }`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        KeyField(KeyTable::from(self.spec())).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RuleKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let KeyField(table) = KeyField::deserialize(deserializer)?;
        table
            .spec()
            .and_then(RuleKey::from_spec)
            .map_err(de::Error::custom)
    }
}

struct KeyText;

impl<'de> Visitor<'de> for KeyText {
    type Value = KeyTable;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a key: \"peer_ip\", \"global\", \"route\", or a table with a `kind` \
             (client_ip, header, peer_ip) and its options",
        )
    }

    fn visit_str<E: de::Error>(self, kind: &str) -> Result<KeyTable, E> {
        Ok(KeyTable {
            kind: kind.to_owned(),
            ..KeyTable::default()
        })
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<KeyTable, M::Error> {
        KeyTable::deserialize(MapAccessDeserializer::new(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, serde::Serialize)]
    struct File {
        policy: PolicyTable,
    }

    fn read(text: &str) -> Result<PolicyTable, String> {
        toml::from_str::<File>(text)
            .map(|f| f.policy)
            .map_err(|e| e.to_string())
    }

    const FULL: &str = r#"
[[policy]]
name = "health"
exempt = true
routes = ["GET /health"]
grpc = ["/grpc.health.v1.Health/*"]

[[policy]]
name = "login"
quotas = ["5/min", "20/h"]
routes = ["POST /login"]
key = { kind = "client_ip", trusted_proxies = ["10.0.0.0/8"], ipv6_prefix = 56 }

[[policy]]
name = "writes"
quotas = ["2/s burst 10"]
grpc = ["/shop.v1.Orders/Create"]
key = { kind = "client_ip", hops = 2, only_from = ["10.1.0.0/16"], forwarded = true }

[[policy]]
name = "tenants"
quotas = ["100/min"]
routes = ["/tenants/{id}"]
key = { kind = "header", name = "x-tenant" }

[[policy]]
name = "edge"
quotas = ["1000/min"]
routes = ["/edge"]
key = { kind = "client_ip", header = "cf-connecting-ip", only_from = ["173.245.48.0/20"] }

[[policy]]
name = "api"
quotas = ["10/s burst 20"]
key = "peer_ip"
"#;

    #[test]
    fn a_table_reads_and_writes_back_the_same() {
        let table = read(FULL).unwrap();
        let rules = table.rules();
        assert_eq!(
            rules.iter().map(PolicyRule::name).collect::<Vec<_>>(),
            ["health", "login", "writes", "tenants", "edge", "api"]
        );
        assert_eq!(
            rules[1].policy().unwrap().quotas(),
            [Quota::per_minute(5).unwrap(), Quota::per_hour(20).unwrap()]
        );
        assert_eq!(
            rules[1].rule_key(),
            Some(
                &RuleKey::client_ip_trusted_proxies(["10.0.0.0/8"])
                    .unwrap()
                    .ipv6_prefix(56)
                    .unwrap()
            )
        );
        let written = toml::to_string(&File {
            policy: table.clone(),
        })
        .unwrap();
        let again = read(&written).unwrap();
        assert_eq!(again.rules(), rules, "{written}");
        // Keys without options are written as their kind alone.
        assert!(written.contains("key = \"peer_ip\""), "{written}");
    }

    /// The message of reading `entry` as the only policy.
    fn error_of(entry: &str) -> String {
        let text = format!("[[policy]]\nname = \"p\"\n{entry}\n");
        match read(&text) {
            Ok(table) => panic!("{entry:?} was accepted: {table:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn mistakes_name_the_entry_and_the_value() {
        for (entry, says) in [
            (
                "quotas = [\"0/s\"]",
                "policy \"p\": \"0/s\": tokens per period must be at least 1",
            ),
            (
                "quotas = [\"10/fortnight\"]",
                "policy \"p\": \"10/fortnight\": unknown unit",
            ),
            ("quotas = []", "policy \"p\" needs at least one quota"),
            (
                "quotas = [\"1/s\"]\nroutes = [\"login\"]",
                "policy \"p\": route \"login\": must start with /",
            ),
            (
                "quotas = [\"1/s\"]\ngrpc = [\"Orders/Create\"]",
                "policy \"p\": gRPC method \"Orders/Create\": write a gRPC method as",
            ),
            (
                "quotas = [\"1/s\"]\nkey = \"client_ip\"",
                "invalid key extractor: policy \"p\": a client_ip key takes one of",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"client_ip\", hops = 1 }",
                "needs `only_from`",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"client_ip\", header = \"x-real-ip\" }",
                "needs `only_from`",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"client_ip\", trusted_proxies = [\"0.0.0.0/0\"] }",
                "would trust every address",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"client_ip\", hops = 1, trust_any_peer = true }",
                "unknown field `trust_any_peer`",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"peer_ip\", hops = 1 }",
                "takes no `hops`",
            ),
            (
                "quotas = [\"1/s\"]\nkey = \"x_api_key\"",
                "unknown key kind \"x_api_key\"",
            ),
            (
                "quotas = [\"1/s\"]\nkey = { kind = \"header\" }",
                "needs the header's `name`",
            ),
            (
                "quotas = [\"1/s\"]\nroute = [\"/x\"]",
                "unknown field `route`",
            ),
            (
                "exempt = true\nquotas = [\"1/s\"]",
                "is exempt: it takes no quotas",
            ),
        ] {
            let err = error_of(entry);
            assert!(err.contains(says), "{entry:?}: {err}");
        }
        // The position comes from the format: the second entry's line.
        let err = read(&format!(
            "{FULL}\n[[policy]]\nname = \"late\"\nquotas = [\"1/s\"]\n"
        ))
        .unwrap_err();
        assert!(
            err.contains("policy \"late\" (entry 7) can never apply: policy \"api\" (entry 6)"),
            "{err}"
        );
    }

    #[test]
    fn no_secret_in_a_message() {
        // A header key's name is configuration; its values never reach a message.
        let err =
            error_of("quotas = [\"1/s\"]\nkey = { kind = \"header\", name = \"bad header\" }");
        assert!(
            err.contains("\"bad header\" is not a valid header name"),
            "{err}"
        );
    }
}
