//! Tokens as the check reads them (claims, not verified: the server verifies) and breaks
//! them.

use serde_json::Value;

/// A string claim of a JWT (read, not verified: the server verifies it).
fn claim(token: &str, name: &str) -> Option<String> {
    use base64::Engine;
    let part = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims[name].as_str().map(String::from)
}

/// The `sub` claim of a JWT.
pub(super) fn token_sub(token: &str) -> Option<String> {
    claim(token, "sub")
}

/// The `plan_id` claim of a confirmation token.
pub(super) fn plan_id_of(token: &str) -> Option<String> {
    claim(token, "plan_id")
}

/// The token with one character of its signature changed (in the middle, where every bit
/// of the character counts).
pub(super) fn tamper(token: &str) -> String {
    let Some((head, sig)) = token.rsplit_once('.') else {
        return format!("{token}x");
    };
    let mut chars: Vec<char> = sig.chars().collect();
    let i = chars.len() / 2;
    if let Some(c) = chars.get_mut(i) {
        *c = if *c == 'A' { 'B' } else { 'A' };
    }
    format!("{head}.{}", chars.into_iter().collect::<String>())
}

/// A well-formed ES256 JWS whose signature is zeros, for when no plan gave a token.
pub(super) const BOGUS_TOKEN: &str = "eyJhbGciOiJFUzI1NiIsInR5cCI6IkpXVCJ9.eyJwbGFuX2lkIjoibm9uZSJ9.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_read_and_tampered() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}.{}",
            b64.encode(br#"{"alg":"ES256"}"#),
            b64.encode(br#"{"sub":"op-1","plan_id":"pln_1"}"#),
            "A".repeat(86)
        );
        assert_eq!(token_sub(&token).as_deref(), Some("op-1"));
        assert_eq!(plan_id_of(&token).as_deref(), Some("pln_1"));
        let t = tamper(&token);
        assert_ne!(t, token);
        assert_eq!(t.len(), token.len());
        assert_eq!(
            t.rsplit_once('.').unwrap().0,
            token.rsplit_once('.').unwrap().0
        );
        assert_eq!(token_sub("not a jwt"), None);
    }
}
