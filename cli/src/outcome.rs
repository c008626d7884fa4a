//! What a command answers: text for people, JSON for scripts, and its exit
//! code.

use std::process::ExitCode;

use serde_json::Value;

/// A command's answer.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// For people: printed without `--json`.
    pub(crate) text: String,
    /// For scripts: printed with `--json`.
    pub(crate) json: Value,
    /// 0, or 1 for a refused `check`.
    pub(crate) code: ExitCode,
}

impl Outcome {
    /// An answer that exits 0.
    pub(crate) fn done(text: String, json: Value) -> Self {
        Outcome {
            text,
            json,
            code: ExitCode::SUCCESS,
        }
    }
}
