//! The token bucket script: its Lua source, and its variants (each another
//! script, with another SHA) made by replacing the lines the Lua files mark
//! with `-- tollgate:NAME`.

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

/// A script and its SHA-1, as `EVALSHA` needs it.
#[derive(Clone, Debug)]
pub(crate) struct Script {
    pub(crate) source: String,
    pub(crate) sha: String,
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
        Script { source, sha }
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
    marked(&source, "margin", "local MARGIN_MS = 1000")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The markers the variants replace lines by.
    const MARKERS: [&str; 6] = [
        "clock",
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
        // Outside comments, production never reads the clock argument.
        let code = |s: &str| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert!(!code(&production.source).contains("ARGV[1]"));
        assert!(code(&test.source).contains("ARGV[1]"));
    }
}
