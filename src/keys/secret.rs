//! Secrets the gateway issues: `tg_`, then 43 base62 characters that carry 256 bits drawn from
//! the operating system's CSPRNG, then 6 base62 characters of CRC-32 over what comes before
//! (GitHub's token format is the model). The prefix tells a secret scanner whose key it is;
//! the checksum lets it (and `POST /api/keys/revoke`) tell a real-looking Tollgate key from
//! noise, or from one mistyped, without a call. The checksum is no secret and proves nothing
//! but the shape: only the digest authenticates.

/// What every issued secret begins with.
pub(crate) const PREFIX: &str = "tg_";
/// Characters of the random part: 62^43 > 2^256.
const BODY: usize = 43;
/// Characters of the checksum: 62^6 > 2^32.
const CHECK: usize = 6;
/// An issued secret's length.
pub(crate) const LEN: usize = PREFIX.len() + BODY + CHECK;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// What a presented secret looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// One of the gateway's: the prefix, the length, base62, and a checksum that matches.
    Issued,
    /// It starts with the prefix but is not one of the gateway's (cut, mistyped, made up).
    Malformed,
    /// Not in the gateway's format at all (a key from the YAML may be anything).
    Other,
}

/// A new secret, from the operating system's CSPRNG.
// Issued by `POST /api/keys` once it exists; tested now.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn issue() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(from_random(bytes))
}

/// The secret whose random part is `bytes`.
#[cfg_attr(not(test), allow(dead_code))]
fn from_random(bytes: [u8; 32]) -> String {
    let mut s = String::with_capacity(LEN);
    s.push_str(PREFIX);
    s.extend(base62::<BODY>(&bytes).iter().map(|&c| char::from(c)));
    let check = checksum(&s);
    s.extend(check.iter().map(|&c| char::from(c)));
    s
}

/// The shape of `secret` (see [`Shape`]).
pub(crate) fn shape(secret: &str) -> Shape {
    if !secret.starts_with(PREFIX) {
        return Shape::Other;
    }
    let b = secret.as_bytes();
    if b.len() != LEN || !b[PREFIX.len()..].iter().all(u8::is_ascii_alphanumeric) {
        return Shape::Malformed;
    }
    let (head, check) = secret.split_at(LEN - CHECK);
    if checksum(head) == check.as_bytes() {
        Shape::Issued
    } else {
        Shape::Malformed
    }
}

/// CRC-32 of `head` in [`CHECK`] base62 characters.
fn checksum(head: &str) -> [u8; CHECK] {
    base62::<CHECK>(&crc32fast::hash(head.as_bytes()).to_be_bytes())
}

/// The big-endian number `bytes` in `N` base62 digits, most significant first (`N` large
/// enough for it).
fn base62<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut n = bytes.to_vec();
    let mut out = [ALPHABET[0]; N];
    for digit in out.iter_mut().rev() {
        let mut rem = 0u32;
        for b in n.iter_mut() {
            let cur = (rem << 8) | u32::from(*b);
            *b = (cur / 62) as u8;
            rem = cur % 62;
        }
        *digit = ALPHABET[rem as usize];
    }
    debug_assert!(n.iter().all(|&b| b == 0), "{N} digits hold the number");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_secret_has_the_prefix_the_length_and_a_checksum_that_matches() {
        let s = issue().unwrap();
        assert_eq!(s.len(), LEN);
        assert!(s.starts_with("tg_"));
        assert_eq!(shape(&s), Shape::Issued);
        assert_ne!(issue().unwrap(), s, "random");
    }

    #[test]
    fn the_extremes_of_the_random_part_fit_in_their_digits() {
        let zero = from_random([0; 32]);
        assert_eq!(&zero[3..46], "0".repeat(43));
        let max = from_random([0xff; 32]);
        assert_eq!(shape(&zero), Shape::Issued);
        assert_eq!(shape(&max), Shape::Issued);
        // 2^256 − 1 in base62 is 43 digits, the first of them not 0 (62^42 < 2^256).
        assert_ne!(&max[3..4], "0");
    }

    #[test]
    fn base62_agrees_with_u128_arithmetic() {
        for v in [
            0u128,
            1,
            61,
            62,
            3843,
            3844,
            u128::from(u64::MAX),
            u128::MAX,
        ] {
            let digits = base62::<22>(&v.to_be_bytes());
            let back = digits.iter().fold(0u128, |acc, &c| {
                let d = ALPHABET.iter().position(|&a| a == c).unwrap() as u128;
                acc.wrapping_mul(62).wrapping_add(d)
            });
            assert_eq!(back, v);
        }
    }

    #[test]
    fn every_single_character_changed_is_malformed() {
        let s = issue().unwrap();
        for i in PREFIX.len()..s.len() {
            for c in [b'0', b'Z', b'z'] {
                let mut b = s.clone().into_bytes();
                if b[i] == c {
                    continue;
                }
                b[i] = c;
                let t = String::from_utf8(b).unwrap();
                assert_eq!(shape(&t), Shape::Malformed, "{i}: {t}");
            }
        }
    }

    #[test]
    fn cut_or_padded_or_not_base62_is_malformed_and_anything_else_is_other() {
        let s = issue().unwrap();
        assert_eq!(shape(&s[..LEN - 1]), Shape::Malformed);
        assert_eq!(shape(&format!("{s}0")), Shape::Malformed);
        let mut b = s.clone().into_bytes();
        b[10] = b'-';
        assert_eq!(shape(&String::from_utf8(b).unwrap()), Shape::Malformed);
        assert_eq!(shape("tg_"), Shape::Malformed);
        assert_eq!(shape("basic-key-1"), Shape::Other);
        assert_eq!(shape("TG_abc"), Shape::Other);
        assert_eq!(shape(""), Shape::Other);
    }
}
