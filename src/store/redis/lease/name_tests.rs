//! The lease map's tests of names: held whole or after a numbered start,
//! found whole or from any split.

use super::entry::{self, SHORT_NAME};
use super::tests::{check, held, leases, policy, with_entry};
use super::*;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::store::key::MAX_RAW_KEY_LEN;

/// Whether the entry of `key` under `policy` holds its name in its line
/// pair (`None`: no entry).
fn held_inline(leases: &Leases, key: &str, policy: &Policy) -> Option<bool> {
    with_entry(leases, key, policy, |e| e.name_len != entry::LONG)
}

#[test]
fn names_after_a_numbered_start_are_held_in_the_entry() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    // A long policy and header name, and a hashed value's length.
    let start = "a-long-policy-name:header:x-api-key:";
    let value = |c: char| format!("#{}", c.to_string().repeat(32));
    let before = format!("{start}{}", value('a'));
    held(&leases, &before, &p, 1, 10);
    assert_eq!(
        held_inline(&leases, &before, &p),
        Some(false),
        "too long whole"
    );
    // A layer numbers its start when it is built: names made after it
    // keep only the value.
    let numbered = leases.start(start);
    assert!(numbered.number().is_some());
    let after = format!("{start}{}", value('b'));
    held(&leases, &after, &p, 2, 10);
    assert_eq!(held_inline(&leases, &after, &p), Some(true));
    // Both are found from the start and the value, and whole, as one key.
    for (key, v) in [(&before, value('a')), (&after, value('b'))] {
        let mut errand = Errand::default();
        let spent = leases.check_held(&numbered, &v, &p, 1, &mut errand);
        let left = spent.map(|s| s.decision(&p.quotas()[0]).remaining());
        assert_eq!(left, Some(9), "{key}");
        assert_eq!(check(&leases, key, &p).0.map(|d| d.remaining()), Some(8));
    }
    // A start that is not the name's own is no match.
    let other = leases.start("a-long-policy-name:header:x-api-kez:");
    let mut errand = Errand::default();
    assert!(
        leases
            .check_held(&other, &value('b'), &p, 1, &mut errand)
            .is_none()
    );
}

/// A name is found whole (`check`) or from a start and a value
/// (`check_held`, split anywhere), held in its entry or, longer than
/// [`SHORT_NAME`], beside it; under another policy's tails it is
/// another key; a value that would not be its own safe form is
/// declined.
#[test]
fn names_of_every_length_are_found_in_pieces() {
    let leases = leases();
    let p = policy(&[Quota::per_second(100).unwrap()]);
    let other = Policy::new("p", [Quota::per_second(200).unwrap()]).unwrap();
    let start = "p:header:";
    let lens = [1, SHORT_NAME - start.len(), SHORT_NAME + 1 - start.len()];
    for (id, len) in (1..).zip(lens.into_iter().chain([MAX_RAW_KEY_LEN - start.len()])) {
        let value = "v".repeat(len);
        let key = format!("{start}{value}");
        held(&leases, &key, &p, id, 10);
        let mut left = 10;
        for split in [0, 1, start.len(), key.len() - 1] {
            let (head, tail) = key.split_at(split.max(1));
            let mut errand = Errand::default();
            let decided = leases.check_held(&leases.start(head), tail, &p, 1, &mut errand);
            left -= 1;
            let decided = decided.map(|spent| spent.decision(&p.quotas()[0]));
            assert_eq!(decided.map(|d| d.remaining()), Some(left), "{len} {split}");
        }
        let mut errand = Errand::default();
        let s = leases.start(start);
        assert!(
            leases
                .check_held(&s, &value, &other, 1, &mut errand)
                .is_none()
        );
        assert!(
            leases
                .check_held(&s, &format!("{value} "), &p, 1, &mut errand)
                .is_none()
        );
        let long = "v".repeat(MAX_RAW_KEY_LEN + 1 - start.len());
        assert!(leases.check_held(&s, &long, &p, 1, &mut errand).is_none());
        assert_eq!(
            check(&leases, &key, &p).0.map(|d| d.remaining()),
            Some(left - 1)
        );
    }
}

proptest::proptest! {
    #![proptest_config(crate::hostile_input::config())]

    /// Whatever starts are numbered, before the names' entries are made or
    /// after, and however many (past the 255 numbers too: every split
    /// checked numbers its head), each name is one entry, found whole and
    /// from every split of it, deciding from its own hold.
    #[test]
    fn names_are_found_whatever_starts_are_numbered(
        early in proptest::collection::vec("[ab:]{0,6}", 0..4),
        names in proptest::collection::btree_set("[ab:]{1,50}", 1..6),
        late in proptest::collection::vec("[ab:]{0,6}", 0..3),
    ) {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        for start in &early {
            leases.start(start);
        }
        for (id, name) in (1..).zip(&names) {
            held(&leases, name, &p, id, 1_000);
        }
        for start in &late {
            leases.start(start);
        }
        for name in &names {
            let mut left = 1_000;
            for split in 1..name.len() {
                let (head, tail) = name.split_at(split);
                let mut errand = Errand::default();
                let spent = leases.check_held(&leases.start(head), tail, &p, 1, &mut errand);
                left -= 1;
                let remaining = spent.map(|s| s.decision(&p.quotas()[0]).remaining());
                proptest::prop_assert_eq!(remaining, Some(left), "{} at {}", name, split);
            }
            left -= 1;
            let remaining = check(&leases, name, &p).0.map(|d| d.remaining());
            proptest::prop_assert_eq!(remaining, Some(left), "{} whole", name);
        }
    }

    /// An entry is its own name, split anywhere, and no other name near it
    /// (one byte more, less or changed), whatever start it keeps its name
    /// after. (A table asks only on a tag match, so the look-ups above
    /// rarely ask an entry about another name.)
    #[test]
    fn an_entry_is_its_name_and_no_other(
        starts in proptest::collection::vec("[ab:]{1,6}", 0..4),
        name in "[ab:]{1,50}",
        split in 0usize..52,
    ) {
        let leases = leases();
        let p = policy(&[Quota::per_second(100).unwrap()]);
        for start in &starts {
            leases.start(start);
        }
        let entry = entry::Entry::new(&name, &p, 0, &leases.starts, || 1);
        let flip = |c: char| if c == 'a' { "b" } else { "a" };
        let mut near = vec![name.clone(), format!("{name}a"), format!("a{name}")];
        if let (Some(first), Some(last)) = (name.chars().next(), name.chars().last()) {
            near.push(name[1..].to_owned());
            near.push(name[..name.len() - 1].to_owned());
            near.push(format!("{}{}", flip(first), &name[1..]));
            near.push(format!("{}{}", &name[..name.len() - 1], flip(last)));
        }
        for probe in near.iter().filter(|n| !n.is_empty()) {
            let same = *probe == name;
            let (head, tail) = probe.split_at(split.min(probe.len()));
            let start = leases.start(head);
            let is_split = entry.is_split(&start, tail.as_bytes(), &p, &leases.starts);
            proptest::prop_assert_eq!(is_split, same, "{} as {}|{}", name, head, tail);
            let is = entry.is(probe.as_bytes(), &p, &leases.starts);
            proptest::prop_assert_eq!(is, same, "{} as {}", name, probe);
        }
    }
}
