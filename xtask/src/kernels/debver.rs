//! Debian version ordering (Debian Policy 5.6.12), enough to pick the
//! newest kernel package of a suite without asking dpkg once per pair.

use std::cmp::Ordering;

/// Compares two Debian versions `[epoch:]upstream[-revision]`.
pub fn compare(a: &str, b: &str) -> Ordering {
    let (ea, ua, ra) = split(a);
    let (eb, ub, rb) = split(b);
    ea.cmp(&eb)
        .then_with(|| compare_part(ua, ub))
        .then_with(|| compare_part(ra, rb))
}

fn split(v: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, rest)) if e.chars().all(|c| c.is_ascii_digit()) => (e.parse().unwrap_or(0), rest),
        _ => (0, v),
    };
    match rest.rsplit_once('-') {
        Some((upstream, revision)) => (epoch, upstream, revision),
        None => (epoch, rest, ""),
    }
}

/// Alternating non-digit and digit runs; in non-digit runs `~` sorts
/// before everything (even the end), letters before other characters.
fn compare_part(mut a: &str, mut b: &str) -> Ordering {
    while !a.is_empty() || !b.is_empty() {
        let (na, ra) = take(a, |c| !c.is_ascii_digit());
        let (nb, rb) = take(b, |c| !c.is_ascii_digit());
        let ord = compare_text(na, nb);
        if ord != Ordering::Equal {
            return ord;
        }
        let (da, ra) = take(ra, |c| c.is_ascii_digit());
        let (db, rb) = take(rb, |c| c.is_ascii_digit());
        let ord = compare_digits(da, db);
        if ord != Ordering::Equal {
            return ord;
        }
        (a, b) = (ra, rb);
    }
    Ordering::Equal
}

fn take(s: &str, f: impl Fn(char) -> bool) -> (&str, &str) {
    let end = s.find(|c| !f(c)).unwrap_or(s.len());
    s.split_at(end)
}

fn weight(c: Option<char>) -> i32 {
    match c {
        Some('~') => -1,
        None => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c as u8),
        Some(c) => i32::from(c as u8) + 256,
    }
}

fn compare_text(a: &str, b: &str) -> Ordering {
    let (mut ca, mut cb) = (a.chars(), b.chars());
    loop {
        let (x, y) = (ca.next(), cb.next());
        if x.is_none() && y.is_none() {
            return Ordering::Equal;
        }
        let ord = weight(x).cmp(&weight(y));
        if ord != Ordering::Equal {
            return ord;
        }
    }
}

fn compare_digits(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_like_dpkg() {
        for (a, b) in [
            ("5.10.237-1", "5.10.244-1"),
            ("6.1.99-1", "6.1.158-1"),
            ("6.12.118-1", "6.12.118-1+deb13u1"),
            ("7.2~rc3-1~exp1", "7.2-1"),
            ("7.2.13-1", "1:6.0-1"),
            ("1.0a", "1.0b"),
            ("1.0", "1.0a"),
            ("1.0~", "1.0"),
        ] {
            assert_eq!(compare(a, b), Ordering::Less, "{a} < {b}");
            assert_eq!(compare(b, a), Ordering::Greater, "{b} > {a}");
        }
        assert_eq!(compare("6.1.0-01", "6.1.0-1"), Ordering::Equal);
    }
}
