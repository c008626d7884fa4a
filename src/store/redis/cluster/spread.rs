//! The script for a batch whose clients live in several slots of one
//! cluster node: the token bucket script behind the prologue of
//! `lua/cluster_batch.lua`, its bucket reads and writes going through what
//! the prologue read.

#[cfg(feature = "test-util")]
use super::super::script::with_test_clock;
use super::super::script::{SOURCE, Script, marked};

/// What goes in front of [`SOURCE`] for a batch whose clients live in
/// several slots of one cluster node (see `lua/cluster_batch.lua`).
const SPREAD_PROLOGUE: &str = include_str!("../../../../lua/cluster_batch.lua");

impl Script {
    /// The script for a batch spread over several slots of one cluster node
    /// (a `Batch` made with a `SlotOf`): the same body behind a prologue that takes the keys
    /// from `ARGV` (only those of the first key's slot are declared), checks that the node serves every one of them before
    /// anything is written, and replies `{-1}` if not. Another SHA; no shebang
    /// line, so it runs as the production script does (see the prologue).
    pub(crate) fn spread() -> Self {
        Self::new(spread_source(SOURCE))
    }

    /// [`Script::spread`] over the test clock of [`Script::with_test_clock`].
    #[cfg(feature = "test-util")]
    pub(crate) fn spread_with_test_clock() -> Self {
        Self::new(with_test_clock(&spread_source(SOURCE)))
    }
}

/// `body` behind the batch prologue, its bucket reads and writes going
/// through the values the prologue read (`held`, see
/// `lua/cluster_batch.lua`): a read comes from there, a write goes there too.
/// Every read and write line is rewritten: the general path's, and the
/// compact form's. The body's clock line is taken out: the prologue reads
/// the clock into the same `now`, before it reads any key.
fn spread_source(body: &str) -> String {
    let body = marked(
        body,
        "clock",
        "-- now: Redis TIME, read by the prologue before any key",
    );
    let read =
        "local stored = held[key]\nif stored == nil then\n  stored = call(\"GET\", key)\nend";
    let body = marked(&body, "get", read);
    let body = marked(&body, "compact-get", read);
    let body = marked(
        &body,
        "set",
        "held[key] = value\ncall(\"SET\", key, value, \"PX\", format(INT, ttl + MARGIN_MS))",
    );
    let body = marked(
        &body,
        "compact-set",
        "held[key] = value\ncall(\"SET\", key, value, \"PX\", px)",
    );
    format!("{SPREAD_PROLOGUE}{body}")
}

#[cfg(test)]
mod tests {
    use super::super::super::encode::{Batch, Spend, args};
    use super::super::slots::hash_slot;
    use super::*;
    use crate::policy::Policy;
    use crate::quota::Quota;
    /// The lines the variants replace, as the Lua files write them.
    const CLOCK_LINE: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";
    #[cfg(feature = "test-util")]
    const MARGIN_LINE: &str = "local MARGIN_MS = 1 -- tollgate:margin";
    const GET_LINE: &str = "local stored = call(\"GET\", key)";
    const SET_LINE: &str = "call(\"SET\", key, value, \"PX\", format(INT, ttl + MARGIN_MS))";
    const COMPACT_SET_LINE: &str = "call(\"SET\", key, value, \"PX\", px)";

    /// The clock's one line of the batch prologue is marked as the script's
    /// lines are (see `each_marker_ends_exactly_one_line` in `script.rs`).
    #[test]
    fn the_prologue_marks_its_clock_line_once() {
        let ending = |source: &str, name: &str| {
            source
                .split('\n')
                .filter(|l| l.ends_with(&format!(" -- tollgate:{name}")))
                .count()
        };
        assert_eq!(ending(SPREAD_PROLOGUE, "clock"), 1, "cluster_batch.lua");
    }

    #[test]
    fn a_spread_batch_declares_the_keys_of_the_first_slot_and_passes_all_in_argv() {
        let q = Quota::per_second(10).unwrap();
        let both = Policy::new("both", [q, Quota::per_hour(100).unwrap()]).unwrap();
        // {u106810} hashes to the slot of {a} (15495), {b} elsewhere.
        assert_eq!(hash_slot(b"{u106810}"), hash_slot(b"{a}"));
        assert_ne!(hash_slot(b"{b}"), hash_slot(b"{a}"));
        let mut plain = Batch::new(None);
        let mut spread = Batch::with_capacity(0, None, Some(hash_slot));
        for batch in [&mut plain, &mut spread] {
            batch.push(
                ["{a}:1".to_owned(), "{a}:2".to_owned()],
                &both,
                &Spend::check(1),
            );
            batch.push(["{b}:1".to_owned()], &q.into(), &Spend::check(1));
            batch.push(["{u106810}:1".to_owned()], &q.into(), &Spend::check(1));
        }
        let plain_args = args(&plain.command("EVALSHA", "sha", None));
        let spread_args = args(&spread.command("EVALSHA", "sha", None));
        assert_eq!(
            plain_args[..7],
            [
                "EVALSHA",
                "sha",
                "4",
                "{a}:1",
                "{a}:2",
                "{b}:1",
                "{u106810}:1"
            ]
        );
        // Only the keys of the first key's slot declared (they route the
        // call, and keep it whole while that slot migrates)...
        assert_eq!(
            spread_args[..6],
            ["EVALSHA", "sha", "3", "{a}:1", "{a}:2", "{u106810}:1"]
        );
        // ...the same arguments after them...
        assert_eq!(spread_args[6..spread_args.len() - 5], plain_args[7..]);
        // ...then every key in order, and their number.
        assert_eq!(
            spread_args[spread_args.len() - 5..],
            ["{a}:1", "{a}:2", "{b}:1", "{u106810}:1", "4"]
        );
        assert!(spread.not_local(&[-1]));
        assert!(!plain.not_local(&[-1]), "only a spread call can be refused");
        assert!(!spread.not_local(&[1, 0, 0, 0]));
    }

    #[test]
    fn the_spread_script_is_the_body_behind_a_prologue_without_shebang() {
        let spread = Script::spread();
        let production = Script::production();
        assert_ne!(spread.sha, production.sha);
        // The body's bucket reads and writes go through what the prologue
        // read (no second GET, and a repeated key sees the write before).
        // One read and one write on the general path, one of each in the
        // compact form.
        assert_eq!(SOURCE.matches(GET_LINE).count(), 2);
        assert_eq!(SOURCE.matches(SET_LINE).count(), 1);
        assert_eq!(SOURCE.matches(COMPACT_SET_LINE).count(), 1);
        assert_eq!(
            spread
                .source
                .matches(
                    "held[key] = value\n    \
                     call(\"SET\", key, value, \"PX\", format(INT, ttl + MARGIN_MS))"
                )
                .count(),
            1
        );
        assert_eq!(
            spread
                .source
                .matches("held[key] = value\n        call(\"SET\", key, value, \"PX\", px)")
                .count(),
            1
        );
        assert!(!spread.source.contains(GET_LINE));
        // Every write line of the body is rewritten (its marker is gone).
        assert!(!spread.source.contains("-- tollgate:set"));
        assert_eq!(spread.source.matches(SET_LINE).count(), 1);
        assert!(spread.source.contains("local stored = held[key]"));
        assert!(spread.source.contains("held[key] = value"));
        assert!(!spread.source.contains("setmetatable"));
        // The clock is read once, by the prologue, before any key.
        assert_eq!(spread.source.matches(CLOCK_LINE).count(), 1);
        assert_clock_before_keys(&spread.source, CLOCK_LINE);
        // A shebang would change how Redis 7 runs the script (and Redis 6.2
        // refuses it); none is needed for undeclared local keys.
        assert!(!spread.source.starts_with("#!"));
        assert!(!production.source.starts_with("#!"));
    }

    /// `clock` (the line that reads the clock) comes before the first read
    /// of a key in `source` (`lua/cluster_batch.lua`: stamps counted from
    /// before the reads).
    fn assert_clock_before_keys(source: &str, clock: &str) {
        let clock = source.find(clock).expect("the clock line");
        let first_read = source.find("redis.pcall(\"GET\"").expect("a key read");
        assert!(clock < first_read, "the clock is read after the keys");
        // Code after the prologue never reads the clock again.
        let code_after = source[clock..]
            .lines()
            .skip(1)
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code_after.contains("\"TIME\""), "TIME read twice");
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_spread_test_variant_reads_its_clock_before_the_keys_too() {
        let test = Script::spread_with_test_clock();
        assert!(!test.source.contains(CLOCK_LINE));
        assert!(!test.source.contains(MARGIN_LINE));
        assert_eq!(
            test.source.matches("local now = ARGV[1] ~= \"\"").count(),
            1
        );
        assert_clock_before_keys(&test.source, "local now = ARGV[1] ~= \"\"");
        assert_ne!(test.sha, Script::spread().sha);
        assert_ne!(test.sha, Script::with_test_clock().sha);
    }
}
