//! API tokens for CI pipelines.
//!
//! Format: `fwy_` + 32 random base62 characters + 6 base62 characters of CRC-32 over the
//! random part. The prefix lets secret scanners recognise a leaked token; the checksum
//! lets us (and them) reject a mistyped or made-up token without a database lookup. Only
//! the SHA-256 of the token is stored: the token carries ~190 bits of entropy, so a fast
//! hash is safe and lookups stay a single indexed read.

use rand::Rng as _;
use sha2::Digest as _;

/// Every API token starts with this.
pub const PREFIX: &str = "fwy_";
const RANDOM_LEN: usize = 32;
const CHECKSUM_LEN: usize = 6;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A freshly minted token: the secret, shown once, and what is stored.
pub struct MintedToken {
    /// The full token, returned to the client once and never stored.
    pub secret: String,
    /// SHA-256 of `secret`.
    pub hash: Vec<u8>,
    /// The first characters, safe to show in lists (`fwy_AbC1`).
    pub display_prefix: String,
}

/// Mints a new random token.
pub fn mint() -> MintedToken {
    let mut rng = rand::rngs::OsRng;
    let random: String = (0..RANDOM_LEN).map(|_| ALPHABET[rng.gen_range(0..62)] as char).collect();
    let secret = format!("{PREFIX}{random}{}", checksum(&random));
    MintedToken { hash: hash(&secret), display_prefix: secret[..PREFIX.len() + 4].to_owned(), secret }
}

/// The stored hash of a presented token, or `None` when it is not well-formed (wrong
/// prefix, length, alphabet or checksum).
pub fn parse(token: &str) -> Option<Vec<u8>> {
    let body = token.strip_prefix(PREFIX)?;
    if body.len() != RANDOM_LEN + CHECKSUM_LEN || !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let (random, check) = body.split_at(RANDOM_LEN);
    (checksum(random) == check).then(|| hash(token))
}

fn hash(token: &str) -> Vec<u8> {
    sha2::Sha256::digest(token.as_bytes()).to_vec()
}

fn checksum(random: &str) -> String {
    let mut n = crc32(random.as_bytes());
    let mut out = [b'0'; CHECKSUM_LEN];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 62) as usize];
        n /= 62;
    }
    // Base62 digits are ASCII.
    String::from_utf8_lossy(&out).into_owned()
}

/// CRC-32 (IEEE 802.3, reflected), bit by bit: tokens are short, a table is not worth it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn a_minted_token_parses_to_its_hash_and_a_typo_does_not() {
        let t = mint();
        assert!(t.secret.starts_with("fwy_") && t.secret.len() == 4 + 32 + 6);
        assert_eq!(parse(&t.secret), Some(t.hash.clone()));
        let mut typo = t.secret.clone().into_bytes();
        typo[10] = if typo[10] == b'a' { b'b' } else { b'a' };
        assert_eq!(parse(&String::from_utf8(typo).unwrap()), None);
        assert_eq!(parse("fwy_short"), None);
        assert_eq!(parse(&t.secret.replace("fwy_", "ghp_")), None);
    }
}
