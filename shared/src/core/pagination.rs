//! Opaque, tamper-proof cursors. A cursor is `base64url(position) . base64url(mac)`, where
//! the MAC (HMAC-SHA-256, truncated to 128 bits) covers the position and the query's
//! scope: the endpoint, its filters, and the caller's identity and desks. Editing a cursor,
//! or replaying it into another query or for another caller, is 400 `invalid_cursor`.

use base64::Engine;
use hmac::Mac;
use serde::{de::DeserializeOwned, Serialize};

use crate::core::error::{ApiError, Code};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 200;

#[derive(Clone)]
pub struct CursorCodec {
    key: Vec<u8>,
}

fn invalid() -> ApiError {
    ApiError::new(
        Code::InvalidCursor,
        "The cursor is not valid for this query; start again without a cursor.",
    )
    .with_field("cursor", "tampered, truncated, or from another query")
}

impl CursorCodec {
    pub fn new(key: Vec<u8>) -> Self {
        CursorCodec { key }
    }

    fn mac(&self, scope: &str, payload: &[u8]) -> [u8; 16] {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC takes any key");
        m.update(&(scope.len() as u64).to_be_bytes());
        m.update(scope.as_bytes());
        m.update(payload);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }

    /// A key for another purpose, derived from this one (HMAC under a label of its own).
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC takes any key");
        m.update(b"airlock derived key\0");
        m.update(purpose.as_bytes());
        m.finalize().into_bytes().into()
    }

    pub fn encode<K: Serialize>(&self, scope: &str, position: &K) -> String {
        let payload = serde_json::to_vec(position).expect("cursor positions serialize");
        let mac = self.mac(scope, &payload);
        format!("{}.{}", B64.encode(&payload), B64.encode(mac))
    }

    pub fn decode<K: DeserializeOwned>(&self, scope: &str, cursor: &str) -> Result<K, ApiError> {
        if cursor.len() > 1024 {
            return Err(invalid());
        }
        let (p, m) = cursor.split_once('.').ok_or_else(invalid)?;
        let payload = B64.decode(p).map_err(|_| invalid())?;
        let mac = B64.decode(m).map_err(|_| invalid())?;
        if mac.len() != 16 {
            return Err(invalid());
        }
        let mut check = <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC takes any key");
        check.update(&(scope.len() as u64).to_be_bytes());
        check.update(scope.as_bytes());
        check.update(&payload);
        check.verify_truncated_left(&mac).map_err(|_| invalid())?;
        serde_json::from_slice(&payload).map_err(|_| invalid())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let c = CursorCodec::new(b"k".to_vec());
        let cur = c.encode("orders|a", &(5i64, "x".to_string()));
        let back: (i64, String) = c.decode("orders|a", &cur).unwrap();
        assert_eq!(back, (5, "x".into()));
        assert_eq!(
            c.decode::<(i64, String)>("orders|b", &cur)
                .unwrap_err()
                .code,
            Code::InvalidCursor
        );
        let mut edited = cur.clone().into_bytes();
        edited[1] ^= 1;
        let edited = String::from_utf8(edited).unwrap();
        assert!(c.decode::<(i64, String)>("orders|a", &edited).is_err());
        let short = &cur[..cur.len() - 3];
        assert!(c.decode::<(i64, String)>("orders|a", short).is_err());
        let other = CursorCodec::new(b"other".to_vec());
        assert!(other.decode::<(i64, String)>("orders|a", &cur).is_err());
    }
}
