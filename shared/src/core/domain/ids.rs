//! Identifiers: those a client sends (accounts, orders, idempotency keys) and those
//! Airlock makes.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Millis;

/// Client-chosen idempotency key: 1..255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > 255 || !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            Err("idempotency_key must be 1 to 255 printable ASCII characters".into())
        } else {
            Ok(IdempotencyKey(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdempotencyKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Identifiers made by Airlock: a prefix and 26 random base32 characters after a time part,
/// so they sort roughly by creation time (`ord_01...`, `act_...`, `pln_...`).
pub fn new_id(prefix: &str, now: Millis) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut s = String::with_capacity(prefix.len() + 1 + 22);
    s.push_str(prefix);
    s.push('_');
    let t = now.max(0) as u64;
    for i in (0..10).rev() {
        s.push(ALPHABET[((t >> (i * 5)) & 31) as usize] as char);
    }
    let mut rng = rand::thread_rng();
    for _ in 0..12 {
        s.push(ALPHABET[rng.gen_range(0..32)] as char);
    }
    s
}

/// An identifier sent by a client (account or order id): 1 to 64 characters of
/// letters, digits and `-_.:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Ident(String);

impl Ident {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty()
            || s.len() > 64
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            Err("must be 1 to 64 letters, digits or -_.:".into())
        } else {
            Ok(Ident(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Ident {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ident::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_bounds() {
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse(&"a".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("tab\there").is_err());
        assert!(IdempotencyKey::parse(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn ids_sort_by_time() {
        let a = new_id("ord", 1_700_000_000_000);
        let b = new_id("ord", 1_700_000_000_001);
        assert!(a < b, "{a} < {b}");
        assert_eq!(a.len(), 4 + 22);
    }
}
