//! Which policy: an entry of the limits file, or `--policy` and `--quota`.

use std::path::Path;

use tollgate::layer::PolicyTable;
use tollgate::{DEFAULT_POLICY_NAME, Policy, Quota};

use crate::args::LimitArgs;
use crate::fail::Failure;

/// A limits file: its `[[policy]]` entries; any other table is the
/// application's and is left alone.
#[derive(serde::Deserialize)]
struct File {
    policy: Option<PolicyTable>,
}

/// The policy the arguments name, with its quotas.
pub(crate) fn policy(args: &LimitArgs) -> Result<Policy, Failure> {
    match (&args.config, args.quotas.is_empty()) {
        (Some(path), _) => from_file(path, args.policy.as_deref()),
        (None, false) => {
            let quotas = args
                .quotas
                .iter()
                .map(|q| q.parse::<Quota>())
                .collect::<Result<Vec<_>, _>>()?;
            let name = args.policy.as_deref().unwrap_or(DEFAULT_POLICY_NAME);
            Ok(Policy::new(name, quotas)?)
        }
        (None, true) => Err(Failure::usage(
            "no limits: give --config FILE [--policy NAME], or --policy NAME --quota QUOTA \
             (--quota \"10/s burst 20\")",
        )),
    }
}

fn from_file(path: &Path, name: Option<&str>) -> Result<Policy, Failure> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read {shown}: {e}")))?;
    let file: File = toml::from_str(&text).map_err(|e| Failure::usage(format!("{shown}: {e}")))?;
    let Some(table) = file.policy else {
        return Err(Failure::usage(format!("{shown} has no [[policy]] entries")));
    };
    let rules = table.rules();
    let names = || {
        rules
            .iter()
            .filter(|r| !r.is_exempt())
            .map(|r| r.name().to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rule = match name {
        Some(name) => rules.iter().find(|r| r.name() == name).ok_or_else(|| {
            Failure::usage(format!(
                "{shown} has no policy {name:?}; it has {}",
                names()
            ))
        })?,
        None => {
            let mut limited = rules.iter().filter(|r| !r.is_exempt());
            match (limited.next(), limited.next()) {
                (Some(only), None) => only,
                _ => {
                    return Err(Failure::usage(format!(
                        "{shown} has several policies: choose one with --policy ({})",
                        names()
                    )));
                }
            }
        }
    };
    rule.policy().cloned().ok_or_else(|| {
        Failure::usage(format!(
            "policy {:?} of {shown} is exempt: it has no buckets",
            rule.name()
        ))
    })
}
