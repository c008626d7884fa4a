//! Redis Cluster's hash slots: which slot a key is in (CRC16 of its
//! `{hash tag}`), and which checks of a batch share the first one's slot.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // Values from CLUSTER KEYSLOT (Redis 7.0).
        assert_eq!(hash_slot(b"123456789"), 12_739);
        assert_eq!(hash_slot(b"foo"), 12_182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"tollgate:{user:42}:1s"), hash_slot(b"user:42"));
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
}
