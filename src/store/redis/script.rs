//! The token bucket script: its arguments, how it is sent (`EVALSHA`, and
//! `EVAL` when the server has not cached it) and what its reply means.

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, ParsingError, RedisError, ServerErrorKind, Value};

use crate::decision::{Decision, QuotaState, States};
use crate::error::{Error, ErrorKind};
use crate::store::bucket::debt_for;
use crate::{Policy, Quota};

/// The token bucket script as production runs it: the clock is Redis `TIME`.
pub(crate) const SOURCE: &str = include_str!("../../../lua/token_bucket.lua");

/// What goes in front of [`SOURCE`] for a batch whose clients live in
/// several slots of one cluster node (see `lua/cluster_batch.lua`).
#[cfg(feature = "cluster")]
const SPREAD_PROLOGUE: &str = include_str!("../../../lua/cluster_batch.lua");

/// A line of `lua/token_bucket.lua` (or of the batch prologue) that ends
/// with `-- tollgate:NAME` is one the script's variants replace whole, with
/// [`marked`]; each marker ends exactly one line of its file (a test checks
/// it).
/// `source` with the line marked `-- tollgate:{name}` replaced by
/// `replacement` (each of its lines indented as the marked line was). A
/// marker that does not occur leaves `source` as it is; the marker test
/// keeps that from shipping.
#[cfg(any(feature = "test-util", feature = "cluster"))]
fn marked(source: &str, name: &str, replacement: &str) -> String {
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
#[derive(Debug)]
pub(crate) struct Script {
    source: String,
    sha: String,
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

    /// The script for a batch spread over several slots of one cluster node
    /// (`Batch::spread`): the same body behind a prologue that takes the keys
    /// from `ARGV` (only those of the first key's slot are declared), checks that the node serves every one of them before
    /// anything is written, and replies `{-1}` if not. Another SHA; no shebang
    /// line, so it runs as the production script does (see the prologue).
    #[cfg(feature = "cluster")]
    pub(crate) fn spread() -> Self {
        Self::new(spread_source(SOURCE))
    }

    /// [`Script::spread`] over the test clock of [`Script::with_test_clock`].
    #[cfg(all(feature = "cluster", feature = "test-util"))]
    pub(crate) fn spread_with_test_clock() -> Self {
        Self::new(with_test_clock(&spread_source(SOURCE)))
    }

    fn new(source: String) -> Self {
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
fn with_test_clock(source: &str) -> String {
    let clock = "local now = ARGV[1] ~= \"\" and \
                 {math.floor(tonumber(ARGV[1]) / 1000000), tonumber(ARGV[1]) % 1000000} \
                 or redis.call(\"TIME\")";
    let source = marked(source, "clock", clock);
    marked(&source, "margin", "local MARGIN_MS = 1000")
}

/// `body` behind the batch prologue, its bucket reads and writes going
/// through the values the prologue read (`held`, see
/// `lua/cluster_batch.lua`): a read comes from there, a write goes there too.
/// Every read and write line is rewritten: the general path's, and the
/// compact form's. The body's clock line is taken out: the prologue reads
/// the clock into the same `now`, before it reads any key.
#[cfg(feature = "cluster")]
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
        "local value = format(VALUE, level, stamp)\nheld[key] = value\n\
         call(\"SET\", key, value, \"PX\", format(INT, ttl + MARGIN_MS))",
    );
    let body = marked(
        &body,
        "compact-set",
        "held[key] = value\ncall(\"SET\", key, value, \"PX\", px)",
    );
    format!("{SPREAD_PROLOGUE}{body}")
}

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: u16 = 16_384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the next `}`, if not empty) or of the whole key, modulo
/// 16 384, as Redis Cluster computes it.
pub(crate) fn hash_slot(key: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in hash_tag(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let rest = key.get(open + 1..).unwrap_or_default();
    match rest.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => rest.get(..close).unwrap_or(key),
        _ => key,
    }
}

/// Takes out of `items` those of other clients whose keys hash to the slot
/// of the first item's (`key` gives an item's first key). A spread call
/// declares only the keys of its first slot, and while that slot migrates
/// Redis keeps declared keys of several clients waiting (`TRYAGAIN`) until
/// the move ends: such checks go apart instead, one call each. (Two clients
/// in one slot meet in a batch rarely: 16 384 slots.)
pub(crate) fn others_in_first_slot<T>(
    items: &mut Vec<T>,
    key: impl Fn(&T) -> Option<&str>,
) -> Vec<T> {
    let Some(first) = items.first().and_then(&key).map(|k| k.as_bytes().to_vec()) else {
        return Vec::new();
    };
    let (slot, tag) = (hash_slot(&first), hash_tag(&first));
    items
        .extract_if(.., |item| {
            key(item).is_some_and(|k| {
                let k = k.as_bytes();
                hash_slot(k) == slot && hash_tag(k) != tag
            })
        })
        .collect()
}

/// One call of the script: the keys and arguments of one or more decisions,
/// decided in order.
pub(crate) struct Batch {
    clock: Option<u64>,
    /// Keys in `ARGV`, only the first decision's declared (for
    /// [`Script::spread`]); otherwise every key declared.
    spread: bool,
    /// The distinct quotas of the batch; decisions refer to them by index.
    quotas: Vec<Quota>,
    /// Per decision: its keys, one per quota (moved in, and handed back by
    /// [`take_keys`](Self::take_keys)).
    keys: Vec<Vec<String>>,
    /// How many keys `keys` holds.
    key_count: usize,
    /// Per decision: its policy, whose quotas read the reply back.
    shapes: Vec<Policy>,
    /// Per decision: n, cost, then per quota: 1-based quota index, debt.
    args: Vec<u64>,
    /// Whether every decision is a check (no debt) of one quota, the same
    /// for all: then the call takes the script's compact form.
    compact: bool,
}

impl Batch {
    /// An empty batch. `clock` (tests only) replaces Redis `TIME`.
    pub(crate) fn new(clock: Option<u64>) -> Self {
        Batch {
            clock,
            spread: false,
            quotas: Vec::new(),
            keys: Vec::new(),
            key_count: 0,
            shapes: Vec::new(),
            args: Vec::new(),
            compact: true,
        }
    }

    /// An empty batch with room for `n` decisions of one quota each, read
    /// from Redis `TIME`; `spread` as [`spread`](Self::spread) makes it.
    pub(crate) fn with_capacity(n: usize, spread: bool) -> Self {
        Batch {
            clock: None,
            spread,
            quotas: Vec::with_capacity(1),
            keys: Vec::with_capacity(n),
            key_count: 0,
            shapes: Vec::with_capacity(n),
            args: Vec::with_capacity(4 * n),
            compact: true,
        }
    }

    /// An empty batch for [`Script::spread`]: its decisions' clients may be
    /// in several slots of one cluster node.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn spread(clock: Option<u64>) -> Self {
        Batch {
            spread: true,
            ..Self::new(clock)
        }
    }

    /// Whether `reply` says that the node does not serve every key of this
    /// batch (it then wrote nothing).
    pub(crate) fn not_local(&self, reply: &[i64]) -> bool {
        self.spread && reply == [-1]
    }

    /// Adds a decision of `cost` against every quota of `policy`, with one key
    /// per quota; `max_wait_us` above 0 makes it a reservation that may wait
    /// that long.
    pub(crate) fn push(
        &mut self,
        keys: impl Into<Vec<String>>,
        policy: &Policy,
        cost: u64,
        max_wait_us: u64,
    ) {
        let quotas = policy.quotas();
        let keys = keys.into();
        self.key_count += keys.len();
        self.keys.push(keys);
        self.args.push(quotas.len() as u64);
        self.args.push(cost);
        for q in quotas {
            let index = match self.quotas.iter().position(|known| known == q) {
                Some(i) => i,
                None => {
                    self.quotas.push(*q);
                    self.quotas.len() - 1
                }
            };
            self.args.push(index as u64 + 1);
            self.args.push(if max_wait_us == 0 {
                0
            } else {
                debt_for(q, max_wait_us)
            });
        }
        self.compact &= quotas.len() == 1 && max_wait_us == 0 && self.quotas.len() == 1;
        self.shapes.push(policy.clone());
    }

    /// The decisions' keys, in order, taken out of the batch (which then
    /// holds none): to hand each check its keys back after the call.
    pub(crate) fn take_keys(&mut self) -> Vec<Vec<String>> {
        self.key_count = 0;
        std::mem::take(&mut self.keys)
    }

    /// How many decisions the batch holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shapes.len()
    }

    /// Runs the batch with `EVALSHA`; a server that does not have the script
    /// (after a restart, a failover or `SCRIPT FLUSH`; in a cluster, each node
    /// has its own cache) gets it with `EVAL` on the same keys, which also
    /// caches it on that very node.
    pub(crate) async fn run<C: ConnectionLike>(
        &self,
        conn: &mut C,
        script: &Script,
    ) -> Result<Vec<i64>, RedisError> {
        let reply = match self.command("EVALSHA", &script.sha).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.command("EVAL", &script.source).query_async(conn).await
            }
            other => other,
        };
        reply.map(|Numbers(numbers)| numbers)
    }

    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        // Sized up front, so building a batch's command never grows it: the
        // name, the script, the key count, the keys (a spread batch's twice:
        // its declared ones, and all of them after the arguments), the
        // clock, the quota count, three numbers per quota, the decision
        // count, the decisions' numbers and a spread batch's key count (at
        // most 20 digits each).
        let numbers = 5 + 3 * self.quotas.len() + self.args.len();
        let copies = if self.spread { 2 } else { 1 };
        let bytes = name.len()
            + script.len()
            + copies * self.keys.iter().flatten().map(String::len).sum::<usize>()
            + 20 * numbers;
        let mut cmd = redis::Cmd::with_capacity(2 + copies * self.key_count + numbers, bytes);
        cmd.arg(name);
        if self.spread {
            // Every key in the first key's slot is declared, the others are
            // not. The declared keys route the call, and Redis treats them
            // as one while that slot migrates: the old primary serves them
            // only if it holds them all (else `ASK` or `TRYAGAIN`), the new
            // one only after `ASKING` and then with the keys it holds. An
            // undeclared key of that slot would be read as missing on the
            // new primary under `ASKING`, while its bucket is still on the
            // old one.
            let first = self
                .keys
                .iter()
                .flatten()
                .next()
                .map(|k| hash_slot(k.as_bytes()));
            let declared: Vec<&String> = self
                .keys
                .iter()
                .flatten()
                .filter(|k| Some(hash_slot(k.as_bytes())) == first)
                .collect();
            cmd.arg(script).arg(declared.len()).arg(declared);
        } else {
            cmd.arg(script).arg(self.key_count);
            for key in self.keys.iter().flatten() {
                cmd.arg(key);
            }
        }
        match self.clock {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(self.quotas.len());
        for q in &self.quotas {
            cmd.arg(q.full()).arg(q.num()).arg(q.den());
        }
        if self.compact {
            // -D, then each decision's cost (see the script's header).
            cmd.arg(-(self.shapes.len() as i64));
            for decision in self.args.chunks_exact(4) {
                if let [_, cost, _, _] = decision {
                    cmd.arg(*cost);
                }
            }
        } else {
            cmd.arg(self.shapes.len()).arg(&self.args);
        }
        if self.spread {
            for key in self.keys.iter().flatten() {
                cmd.arg(key);
            }
            cmd.arg(self.key_count);
        }
        cmd
    }

    /// What the reply says of each decision, in order: the decision and, for
    /// an admitted reservation, the wait until its tokens are due.
    pub(crate) fn outcomes(&self, reply: &[i64]) -> Result<Vec<(Decision, u64)>, Error> {
        let malformed = || {
            Error::store(
                ErrorKind::Server,
                format!("unexpected reply from the rate limit script: {reply:?}"),
            )
        };
        let expected: usize = self.shapes.iter().map(|s| 1 + 3 * s.quotas().len()).sum();
        if reply.len() != expected {
            return Err(malformed());
        }
        let number = |v: i64| u64::try_from(v).map_err(|_| malformed());
        // One quota's state from its three numbers; an admitted decision has
        // nothing to retry, and its wait (for a reservation) is when the
        // tokens are due.
        let state = |q: &Quota, c: &[i64], allowed: bool, wait: &mut u64| {
            let [remaining, wait_us, reset] = *c else {
                return Err(malformed());
            };
            let wait_us = number(wait_us)?;
            let retry = if allowed {
                *wait = (*wait).max(wait_us);
                0
            } else {
                wait_us
            };
            Ok(QuotaState::new(
                *q,
                number(remaining)?,
                retry,
                number(reset)?,
            ))
        };
        let mut rest = reply;
        let mut out = Vec::with_capacity(self.shapes.len());
        for policy in &self.shapes {
            let quotas = policy.quotas();
            let (allowed, tail) = rest.split_first().ok_or_else(malformed)?;
            let allowed = match *allowed {
                1 => true,
                0 => false,
                _ => return Err(malformed()),
            };
            let (mine, tail) = tail.split_at(3 * quotas.len());
            rest = tail;
            let mut wait = 0;
            let decision = match quotas {
                // One quota (the common case): its state inline, no list.
                [q] => Decision::new(allowed, States::One(state(q, mine, allowed, &mut wait)?)),
                _ => {
                    let mut states = Vec::with_capacity(quotas.len());
                    for (q, c) in quotas.iter().zip(mine.chunks_exact(3)) {
                        states.push(state(q, c, allowed, &mut wait)?);
                    }
                    Decision::new(allowed, states)
                }
            };
            out.push((decision, wait));
        }
        Ok(out)
    }
}

/// The script's reply read as numbers. The script packs them into one string
/// of little-endian doubles (see its header), which the client reads in one
/// go instead of parsing one RESP integer at a time; a list of integers (the
/// spread prologue's `{-1}`) is read as it is.
///
/// A packed reply always reads: numbers it cannot hold come out as
/// [`i64::MIN`], and [`Batch::outcomes`] refuses them as a malformed reply
/// (a server error). A conversion error here would be taken by redis-rs for
/// a broken connection, and the call, which Redis has already run, sent again.
struct Numbers(Vec<i64>);

impl FromRedisValue for Numbers {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        match v {
            Value::BulkString(bytes) => Ok(Numbers(unpacked(&bytes))),
            other => Vec::<i64>::from_redis_value(other).map(Numbers),
        }
    }
}

/// The numbers of a packed reply: little-endian doubles, each converted to an
/// integer as Redis converts a Lua number in a reply (toward zero). One that
/// is not finite or does not fit reads as [`i64::MIN`], as it did from Redis
/// on x86-64, and so do trailing bytes short of a number.
pub(crate) fn unpacked(bytes: &[u8]) -> Vec<i64> {
    /// 2^63, the first double an `i64` cannot hold.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    let (numbers, rest) = bytes.as_chunks::<8>();
    let mut out = Vec::with_capacity(numbers.len() + 1);
    for &number in numbers {
        let number = f64::from_le_bytes(number);
        // In range (NaN is not), `as` truncates toward zero, as Redis does.
        #[expect(
            clippy::cast_possible_truncation,
            reason = "checked to fit just before"
        )]
        out.push(if (-LIMIT..LIMIT).contains(&number) {
            number as i64
        } else {
            i64::MIN
        });
    }
    if !rest.is_empty() {
        out.push(i64::MIN);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(numbers: &[f64]) -> Vec<u8> {
        numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
    }

    #[test]
    fn packed_replies_read_as_the_integers_they_hold() {
        let exact = [0.0, 1.0, 999_999.0, 9_007_199_254_740_991.0, -1.0];
        assert_eq!(
            unpacked(&packed(&exact)),
            vec![0, 1, 999_999, 9_007_199_254_740_991, -1]
        );
        // Toward zero, as Redis turns a Lua number into an integer reply.
        assert_eq!(unpacked(&packed(&[2.75, -0.5])), vec![2, 0]);
        assert_eq!(unpacked(&[]), Vec::<i64>::new());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e19, -1e19] {
            assert_eq!(unpacked(&packed(&[1.0, bad])), vec![1, i64::MIN], "{bad}");
        }
        let mut cut = packed(&[1.0, 2.0]);
        cut.pop();
        assert_eq!(unpacked(&cut), vec![1, i64::MIN]);
        // Through redis-rs as the client reads it: a string, or a list of
        // integers (the spread prologue's `{-1}`). A string always reads, so
        // a bad one is refused by `outcomes` as a server's malformed reply,
        // never taken for a broken connection.
        let read = |v: Value| Numbers::from_redis_value(v).map(|Numbers(n)| n);
        assert_eq!(read(Value::BulkString(packed(&[1.0, 5.0]))), Ok(vec![1, 5]));
        assert_eq!(read(Value::Array(vec![Value::Int(-1)])), Ok(vec![-1]));
        let odd = read(Value::BulkString(vec![0; 12])).unwrap();
        assert_eq!(odd, [0, i64::MIN]);
        let mut batch = Batch::new(None);
        batch.push(
            vec!["k".to_owned()],
            &Policy::from(Quota::per_second(1).unwrap()),
            1,
            0,
        );
        let nan = read(Value::BulkString(packed(&[1.0, 0.0, 0.0, f64::NAN]))).unwrap();
        let err = batch.outcomes(&nan).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Server, "{err:?}");
    }

    #[test]
    fn replies_of_the_wrong_shape_are_store_errors() {
        let mut batch = Batch::new(None);
        batch.push(
            ["k".to_owned()],
            &Quota::per_second(1).unwrap().into(),
            1,
            0,
        );
        assert!(batch.outcomes(&[1, 0, 0, 0]).is_ok());
        for bad in [&[][..], &[1, 0, 0], &[1, -1, 0, 0], &[1, 0, 0, 0, 0]] {
            let err = batch.outcomes(bad).unwrap_err();
            assert!(err.is_store_error(), "{err:?}");
        }
    }

    #[test]
    fn quotas_shared_by_decisions_are_sent_once() {
        let q = Quota::per_second(10).unwrap();
        let h = Quota::per_hour(100).unwrap();
        let both = Policy::new("both", [q, h]).unwrap();
        let mut batch = Batch::new(None);
        batch.push(["a".to_owned()], &q.into(), 1, 0);
        batch.push(["b".to_owned(), "c".to_owned()], &both, 2, 1_000);
        assert_eq!(batch.quotas, [q, h]);
        assert_eq!(batch.len(), 2);
        // n, cost, then (index, debt) per quota.
        assert_eq!(
            batch.args,
            [
                1,
                1,
                1,
                0,
                2,
                2,
                1,
                debt_for(&q, 1_000),
                2,
                debt_for(&h, 1_000)
            ]
        );
        let reply = [1, 9, 0, 100_000, 1, 8, 500, 200_000, 98, 0, 72_000_000];
        let out = batch.outcomes(&reply).unwrap();
        assert!(out[0].0.allowed() && out[1].0.allowed());
        assert_eq!(out[1].1, 500);
        assert_eq!(out[1].0.retry_after(), std::time::Duration::ZERO);
    }

    #[test]
    fn checks_of_one_quota_take_the_compact_form_and_others_the_long_one() {
        let q = Quota::per_second(10).unwrap();
        let h = Quota::per_hour(100).unwrap();
        let decisions = |batch: &Batch| {
            let args = args(&batch.command("EVALSHA", "sha"));
            // EVALSHA, sha, key count, keys, clock, quota count, 3 per quota.
            let start = 3 + batch.key_count + 2 + 3 * batch.quotas.len();
            args[start..].to_vec()
        };
        let mut checks = Batch::new(None);
        checks.push(["a".to_owned()], &q.into(), 1, 0);
        checks.push(["b".to_owned()], &q.into(), 3, 0);
        checks.push(["a".to_owned()], &q.into(), 0, 0);
        assert_eq!(decisions(&checks), ["-3", "1", "3", "0"]);
        // A reservation (debt), a second quota, or a decision over two
        // quotas: the long form, n, cost, then (index, debt) per quota.
        let mut reservation = Batch::new(None);
        reservation.push(["a".to_owned()], &q.into(), 1, 0);
        reservation.push(["b".to_owned()], &q.into(), 1, 1_000);
        let debt = debt_for(&q, 1_000).to_string();
        assert_eq!(
            decisions(&reservation),
            ["2", "1", "1", "1", "0", "1", "1", "1", debt.as_str()]
        );
        let mut two = Batch::new(None);
        two.push(["a".to_owned()], &q.into(), 1, 0);
        two.push(["b".to_owned()], &h.into(), 1, 0);
        assert_eq!(
            decisions(&two),
            ["2", "1", "1", "1", "0", "1", "1", "2", "0"]
        );
        let mut both = Batch::new(None);
        both.push(
            ["a".to_owned(), "b".to_owned()],
            &Policy::new("both", [q, h]).unwrap(),
            2,
            0,
        );
        assert_eq!(decisions(&both), ["1", "2", "2", "1", "0", "2", "0"]);
        // The reply is read the same way in both forms.
        let out = checks
            .outcomes(&[1, 9, 0, 100_000, 0, 0, 200_000, 300_000, 1, 0, 0, 300_000])
            .unwrap();
        assert_eq!(out.len(), 3);
        assert!(out[0].0.allowed() && !out[1].0.allowed() && out[2].0.allowed());
    }

    /// The arguments of `cmd` as text.
    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // Values from CLUSTER KEYSLOT (Redis 7.0).
        assert_eq!(hash_slot(b"123456789"), 12_739);
        assert_eq!(hash_slot(b"foo"), 12_182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(
            hash_slot(b"tollgate:{user:42}:10/1s:10"),
            hash_slot(b"user:42")
        );
        // An empty tag is no tag (the whole key counts); only the first `{`
        // opens a tag.
        assert_eq!(hash_slot(b"foo{}{bar}"), 8_363);
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
        assert_eq!(hash_slot(b"{bar"), 4_015);
    }

    #[test]
    fn other_clients_in_the_first_slot_go_apart() {
        let mut keys = vec!["p:{a}:1", "p:{b}:1", "p:{u106810}:1", "p:{a}:2", "p:{a}:1"];
        let apart = others_in_first_slot(&mut keys, |k| Some(*k));
        assert_eq!(apart, ["p:{u106810}:1"]);
        assert_eq!(keys, ["p:{a}:1", "p:{b}:1", "p:{a}:2", "p:{a}:1"]);
        let mut none: Vec<&str> = Vec::new();
        assert!(others_in_first_slot(&mut none, |k| Some(*k)).is_empty());
    }

    #[test]
    fn a_spread_batch_declares_the_keys_of_the_first_slot_and_passes_all_in_argv() {
        let q = Quota::per_second(10).unwrap();
        let both = Policy::new("both", [q, Quota::per_hour(100).unwrap()]).unwrap();
        // {u106810} hashes to the slot of {a} (15495), {b} elsewhere.
        assert_eq!(hash_slot(b"{u106810}"), hash_slot(b"{a}"));
        assert_ne!(hash_slot(b"{b}"), hash_slot(b"{a}"));
        let mut plain = Batch::new(None);
        let mut spread = Batch::spread(None);
        for batch in [&mut plain, &mut spread] {
            batch.push(["{a}:1".to_owned(), "{a}:2".to_owned()], &both, 1, 0);
            batch.push(["{b}:1".to_owned()], &q.into(), 1, 0);
            batch.push(["{u106810}:1".to_owned()], &q.into(), 1, 0);
        }
        let plain_args = args(&plain.command("EVALSHA", "sha"));
        let spread_args = args(&spread.command("EVALSHA", "sha"));
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

    /// The markers the variants replace lines by.
    #[cfg(any(feature = "test-util", feature = "cluster"))]
    const MARKERS: [&str; 6] = [
        "clock",
        "margin",
        "get",
        "set",
        "compact-get",
        "compact-set",
    ];

    /// The lines the variants replace, as the Lua files write them.
    #[cfg(any(feature = "test-util", feature = "cluster"))]
    const CLOCK_LINE: &str = "local now = redis.call(\"TIME\") -- tollgate:clock";
    #[cfg(feature = "test-util")]
    const MARGIN_LINE: &str = "local MARGIN_MS = 1 -- tollgate:margin";
    #[cfg(feature = "cluster")]
    const GET_LINE: &str = "local stored = call(\"GET\", key)";
    #[cfg(feature = "cluster")]
    const SET_LINE: &str =
        "call(\"SET\", key, format(VALUE, level, stamp), \"PX\", format(INT, ttl + MARGIN_MS))";
    #[cfg(feature = "cluster")]
    const COMPACT_SET_LINE: &str = "call(\"SET\", key, value, \"PX\", px)";

    /// Every marker the variants use ends exactly one line of the script
    /// (and the clock's one line of the batch prologue too), so no variant
    /// silently keeps a line it means to replace.
    #[cfg(any(feature = "test-util", feature = "cluster"))]
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
        #[cfg(feature = "cluster")]
        assert_eq!(ending(SPREAD_PROLOGUE, "clock"), 1, "cluster_batch.lua");
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

    #[cfg(feature = "cluster")]
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
                .matches("local value = format(VALUE, level, stamp)\n    held[key] = value")
                .count(),
            1
        );
        assert_eq!(
            spread
                .source
                .matches("held[key] = value\n      call(\"SET\", key, value, \"PX\", px)")
                .count(),
            1
        );
        assert!(!spread.source.contains(GET_LINE));
        assert!(!spread.source.contains(SET_LINE));
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
    #[cfg(feature = "cluster")]
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

    #[cfg(all(feature = "cluster", feature = "test-util"))]
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
