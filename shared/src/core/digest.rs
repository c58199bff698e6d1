//! Digests of what Airlock stores and compares: lowercase hex SHA-256.

use sha2::{Digest, Sha256};

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    // Written digit by digit: a `format!` per byte would be most of this function's time
    // (about 1 % of the server's CPU under `pairs`, several hashes per plan).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        hex.push(DIGITS[usize::from(b >> 4)] as char);
        hex.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    hex
}
