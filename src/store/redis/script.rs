//! The token bucket script: its Lua source, and its variants (each another
//! script, with another SHA) made by replacing the lines the Lua files mark
//! with `-- tollgate:NAME`.

use std::fmt;
use std::sync::Arc;

use super::epoch::ServerEpoch;

/// The token bucket script as production runs it: the clock is Redis `TIME`.
pub(crate) const SOURCE: &str = include_str!("../../../lua/token_bucket.lua");

/// A line of `lua/token_bucket.lua` (or of the batch prologue) that ends
/// with `-- tollgate:NAME` is one the script's variants replace whole, with
/// [`marked`]; each marker ends exactly one line of its file (a test checks
/// it).
/// `source` with the line marked `-- tollgate:{name}` replaced by
/// `replacement` (each of its lines indented as the marked line was). A
/// marker that does not occur leaves `source` as it is; the marker test
/// keeps that from shipping.
#[allow(
    dead_code,
    reason = "the test-clock and cluster variants use it, and a build may have neither"
)]
pub(crate) fn marked(source: &str, name: &str, replacement: &str) -> String {
    let marker = format!(" -- tollgate:{name}");
    let mut out = String::with_capacity(source.len() + replacement.len());
    let mut done = false;
    for line in source.split_inclusive('\n') {
        let text = line.trim_end_matches(['\r', '\n']);
        if !done && text.ends_with(&marker) {
            done = true;
            // The line's own ending (none, LF or CRLF) after every new line.
            let ending = &line[text.len()..];
            let eol = if ending.is_empty() { "\n" } else { ending };
            let indent = &text[..text.len() - text.trim_start().len()];
            for (i, new) in replacement.lines().enumerate() {
                if i > 0 {
                    out.push_str(eol);
                }
                out.push_str(indent);
                out.push_str(new);
            }
            out.push_str(ending);
        } else {
            out.push_str(line);
        }
    }
    out
}

/// A script and its SHA-1, as `EVALSHA` needs it, and the epoch of the
/// server its calls go to (see `epoch.rs`): calls of a standalone or
/// Sentinel store's production script carry it; the test variant's, and
/// those on a cluster, do not.
#[derive(Clone)]
pub(crate) struct Script {
    pub(crate) source: String,
    pub(crate) sha: String,
    pub(crate) epoch: Option<Arc<ServerEpoch>>,
}

impl fmt::Debug for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Script").field("sha", &self.sha).finish()
    }
}

impl Script {
    /// The production script.
    pub(crate) fn production() -> Self {
        Self::new(SOURCE.to_owned())
    }

    /// The test variant (feature `test-util`): reads a microsecond clock from
    /// `ARGV[1]` when it is not empty. It is another script with another SHA,
    /// so production calls, which send the production script's SHA, can never
    /// run it.
    #[cfg(feature = "test-util")]
    pub(crate) fn with_test_clock() -> Self {
        Self::new(with_test_clock(SOURCE))
    }

    /// `source` and its SHA-1.
    pub(crate) fn new(source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Script {
            source,
            sha,
            epoch: None,
        }
    }

    /// This script, its calls carrying `epoch`.
    pub(crate) fn with_epoch(mut self, epoch: Arc<ServerEpoch>) -> Self {
        self.epoch = Some(epoch);
        self
    }
}

/// The test variant of `source` ([`SOURCE`], or the spread script, whose
/// one clock line is the prologue's): the clock from `ARGV[1]` when it is not
/// empty, and keys that outlive their bucket's refill by 1 s. Redis still
/// expires them by its own clock, which a test clock does not follow: the
/// margin gives a test a second of real time between steps before a key it
/// still needs can expire (the model tests reject the rare case that takes
/// longer).
#[cfg(feature = "test-util")]
pub(crate) fn with_test_clock(source: &str) -> String {
    let clock = "local now = ARGV[1] ~= \"\" and \
                 {math.floor(tonumber(ARGV[1]) / 1000000), tonumber(ARGV[1]) % 1000000} \
                 or redis.call(\"TIME\")";
    let source = marked(source, "clock", clock);
    let source = marked(&source, "epoch", "local epoch_spec = \"\"");
    marked(&source, "margin", "local MARGIN_MS = 1000")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The markers the variants replace lines by.
    const MARKERS: [&str; 7] = [
        "clock",
        "epoch",
        "margin",
        "get",
        "set",
        "compact-get",
        "compact-set",
    ];

    /// The lines the variants replace, as the Lua files write them.
    #[cfg(feature = "test-util")]
    const CLOCK_LINE: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";
    #[cfg(feature = "test-util")]
    const MARGIN_LINE: &str = "local MARGIN_MS = 1 -- tollgate:margin";

    /// Every marker the variants use ends exactly one line of the script
    /// (and the clock's one line of the batch prologue too, see
    /// `cluster/spread.rs`), so no variant silently keeps a line it means to
    /// replace.
    #[test]
    fn each_marker_ends_exactly_one_line() {
        let ending = |source: &str, name: &str| {
            source
                .split('\n')
                .filter(|l| l.ends_with(&format!(" -- tollgate:{name}")))
                .count()
        };
        for name in MARKERS {
            assert_eq!(ending(SOURCE, name), 1, "token_bucket.lua, marker {name}");
            assert_eq!(
                SOURCE.matches(&format!("tollgate:{name}")).count(),
                1,
                "{name}"
            );
        }
        // A marker that does not occur changes nothing; one that does is
        // replaced whole, indented as it was.
        assert_eq!(
            marked("a\n  b -- tollgate:x\nc", "y", "z"),
            "a\n  b -- tollgate:x\nc"
        );
        assert_eq!(
            marked("a\n  b -- tollgate:x\nc", "x", "d\ne"),
            "a\n  d\n  e\nc"
        );
        assert_eq!(
            marked("a\r\n b -- tollgate:x\r\nc", "x", "d\ne"),
            "a\r\n d\r\n e\r\nc"
        );
        assert_eq!(marked("a\n b -- tollgate:x", "x", "d"), "a\n d");
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_test_clock_is_another_script() {
        let test = Script::with_test_clock();
        let production = Script::production();
        assert_ne!(test.sha, production.sha);
        assert!(!test.source.contains(CLOCK_LINE));
        assert!(production.source.contains(CLOCK_LINE));
        assert!(!test.source.contains(MARGIN_LINE));
        assert!(production.source.contains(MARGIN_LINE));
        // Outside comments, production reads ARGV[1] as the epoch only,
        // and the test variant as its clock only.
        let reading = |s: &str| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--") && l.contains("ARGV[1]"))
                .map(str::trim)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            reading(&production.source),
            ["local epoch_spec = ARGV[1] -- tollgate:epoch"]
        );
        let test_reads = reading(&test.source);
        assert_eq!(test_reads.len(), 1, "{test_reads:?}");
        assert!(test_reads[0].starts_with("local now = ARGV[1]"));
    }
}
