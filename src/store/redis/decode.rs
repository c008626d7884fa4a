//! What the script's reply means: the numbers it packs ([`Numbers`]) and the
//! decisions they make ([`outcomes`]).

use redis::{FromRedisValue, ParsingError, Value};

use crate::decision::{Decision, QuotaState, States};
use crate::error::{Error, ErrorKind};
use crate::policy::Policy;
use crate::quota::Quota;
/// What `reply` says of each decision of a call, whose policies are
/// `shapes`, in order: the decision and, for an admitted reservation, the
/// wait until its tokens are due.
///
/// A decision with numbers in `extra` (a lease: 2, a report: 1) has them
/// after its quotas' figures, and they take the wait's place: a report's
/// one as it is, a lease's two packed as [`LeaseReply::packed`] reads
/// them.
pub(crate) fn outcomes(
    shapes: &[Policy],
    extra: &[u8],
    reply: &[i64],
) -> Result<Vec<(Decision, u64)>, Error> {
    let malformed = || {
        Error::store(
            ErrorKind::Server,
            format!("unexpected reply from the rate limit script: {reply:?}"),
        )
    };
    let more = |i: usize| usize::from(extra.get(i).copied().unwrap_or(0));
    let expected: usize = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| 1 + 3 * s.quotas().len() + more(i))
        .sum();
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
    let mut out = Vec::with_capacity(shapes.len());
    for (i, policy) in shapes.iter().enumerate() {
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
        match *rest {
            [first, second, ref tail @ ..] if more(i) == 2 => {
                let flags = number(second)?;
                if flags > 3 {
                    return Err(malformed());
                }
                wait = number(first)?.checked_mul(4).ok_or_else(malformed)? + flags;
                rest = tail;
            }
            [first, ref tail @ ..] if more(i) == 1 => {
                wait = number(first)?;
                rest = tail;
            }
            _ if more(i) > 0 => return Err(malformed()),
            _ => {}
        }
        out.push((decision, wait));
    }
    Ok(out)
}

/// What the script answered a lease: the tokens granted (0: none), whether
/// the report it carried found its hold, and whether it got its roomy size
/// and life (every bucket was at least 3/4 free besides its cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseReply {
    pub(crate) granted: u64,
    pub(crate) found: bool,
    pub(crate) roomy: bool,
}

impl LeaseReply {
    /// Read from the number [`outcomes`] gives a lease: four times the
    /// grant, plus 1 if the report found its hold, plus 2 if roomy (the
    /// script's second number, `found + 2 * roomy`).
    pub(crate) fn packed(packed: u64) -> Self {
        LeaseReply {
            granted: packed >> 2,
            found: packed & 1 == 1,
            roomy: packed & 2 == 2,
        }
    }
}

/// The script's reply read as numbers. The script packs them into one string
/// of little-endian doubles (see its header), which the client reads in one
/// go instead of parsing one RESP integer at a time; a list of integers (the
/// spread prologue's `{-1}`) is read as it is.
///
/// A packed reply always reads: numbers it cannot hold come out as
/// [`i64::MIN`], and [`outcomes`] refuses them as a malformed reply
/// (a server error). A conversion error here would be taken by redis-rs for
/// a broken connection, and the call, which Redis has already run, sent again.
pub(crate) struct Numbers(pub(crate) Vec<i64>);

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
        let shapes = [Policy::from(Quota::per_second(1).unwrap())];
        let nan = read(Value::BulkString(packed(&[1.0, 0.0, 0.0, f64::NAN]))).unwrap();
        let err = outcomes(&shapes, &[], &nan).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Server, "{err:?}");
    }

    #[test]
    fn a_lease_reply_reads_its_grant_and_both_flags() {
        let shapes = [Policy::from(Quota::per_second(1).unwrap())];
        for (flags, found, roomy) in [
            (0, false, false),
            (1, true, false),
            (2, false, true),
            (3, true, true),
        ] {
            let out = outcomes(&shapes, &[2], &[1, 0, 0, 0, 7, flags]).unwrap();
            let reply = LeaseReply::packed(out[0].1);
            assert_eq!(
                reply,
                LeaseReply {
                    granted: 7,
                    found,
                    roomy
                }
            );
        }
        let err = outcomes(&shapes, &[2], &[1, 0, 0, 0, 7, 4]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Server, "{err:?}");
    }

    #[test]
    fn replies_of_the_wrong_shape_are_store_errors() {
        let shapes = [Quota::per_second(1).unwrap().into()];
        assert!(outcomes(&shapes, &[], &[1, 0, 0, 0]).is_ok());
        for bad in [&[][..], &[1, 0, 0], &[1, -1, 0, 0], &[1, 0, 0, 0, 0]] {
            let err = outcomes(&shapes, &[], bad).unwrap_err();
            assert!(err.is_store_error(), "{err:?}");
        }
    }
}
