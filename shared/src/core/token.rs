//! Confirmation tokens: compact JWS, ES256, bound to a plan, its payload hash, the
//! requester, the service principal and the execute audience. Signed through the
//! [`Signer`] port (a local key or KMS); verified locally with the signer's public key,
//! configured (`AIRLOCK_CONFIRMATION_PUBLIC_KEY`) or fetched once per process, so the
//! execute path never calls the signer.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::core::auth::{
    es256_decoding_key, verify_jwt, Issuer, KeySet, KeySource, TokenFault, VerifiedTokens,
};
use std::sync::Arc;

use crate::core::error::StoreResult;
use crate::core::ports::Signer;

pub const CONFIRMATION_ISSUER: &str = "airlock";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmationClaims {
    pub iss: String,
    pub aud: String,
    /// The service principal the plan was made for.
    pub sub: String,
    pub plan_id: String,
    pub payload_hash: String,
    pub requested_by: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Signs `claims` as a compact JWS with the signer's key.
pub async fn sign(signer: &dyn Signer, claims: &ConfirmationClaims) -> StoreResult<String> {
    let header = serde_json::json!({ "alg": "ES256", "typ": "JWT", "kid": signer.key_id() });
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(serde_json::to_vec(claims).expect("claims serialize"))
    );
    let sig = signer.sign(input.as_bytes()).await?;
    Ok(format!("{input}.{}", B64.encode(sig)))
}

/// Where the verifier's public key comes from.
enum KeyOrigin {
    /// The signer's, fetched on first use (KMS: one `GetPublicKey` per process).
    Signer(Arc<dyn Signer>),
    /// `AIRLOCK_CONFIRMATION_PUBLIC_KEY`: known at construction, never fetched.
    Configured,
}

impl KeyOrigin {
    fn describe(&self) -> &'static str {
        match self {
            KeyOrigin::Signer(_) => "the signer",
            KeyOrigin::Configured => "AIRLOCK_CONFIRMATION_PUBLIC_KEY",
        }
    }
}

/// The verification key, once known: the issuer to verify against, and the key itself (to
/// say why a token failed).
struct Loaded {
    issuer: Issuer,
    public: p256::PublicKey,
}

/// Verifies confirmation tokens with the signer's public key: configured
/// ([`ConfirmationVerifier::with_public_key`], no call at all), or fetched once on first
/// use ([`ConfirmationVerifier::new`]). Either way the key is registered under the
/// signer's key id, the `kid` every token of that signer carries.
pub struct ConfirmationVerifier {
    audience: String,
    kid: String,
    origin: KeyOrigin,
    keys: tokio::sync::OnceCell<Loaded>,
    /// Tokens this process signed with the verifier's own signer ([`Self::issued`]), by
    /// SHA-256 of the token, until their `exp`.
    issued: VerifiedTokens<ConfirmationClaims>,
}

impl ConfirmationVerifier {
    /// Fetches the signer's public key on first use (or at [`Self::preload`]).
    pub fn new(audience: &str, signer: Arc<dyn Signer>) -> Self {
        ConfirmationVerifier {
            audience: audience.to_string(),
            kid: signer.key_id().to_string(),
            origin: KeyOrigin::Signer(signer),
            keys: tokio::sync::OnceCell::new(),
            issued: VerifiedTokens::default(),
        }
    }

    /// Verifies with `public`, the configured key of signer `kid`: no signer call, ever.
    /// A key that is not the signer's refuses every token (`token_invalid`), and the log
    /// says so; it never falls back to fetching the signer's key.
    pub fn with_public_key(audience: &str, kid: &str, public: &p256::PublicKey) -> Self {
        ConfirmationVerifier {
            audience: audience.to_string(),
            kid: kid.to_string(),
            origin: KeyOrigin::Configured,
            keys: tokio::sync::OnceCell::new_with(Some(Self::loaded(audience, kid, *public))),
            issued: VerifiedTokens::default(),
        }
    }

    fn loaded(audience: &str, kid: &str, public: p256::PublicKey) -> Loaded {
        let mut set = KeySet::default();
        set.insert(
            kid,
            jsonwebtoken::Algorithm::ES256,
            es256_decoding_key(&public),
        );
        Loaded {
            issuer: Issuer::new(CONFIRMATION_ISSUER, audience, KeySource::Static(set)),
            public,
        }
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// Whether the key is configured (no signer call at all) rather than fetched.
    pub fn is_configured(&self) -> bool {
        matches!(self.origin, KeyOrigin::Configured)
    }

    /// Loads the public key now, so the first execute makes no signer call: a configured
    /// key is there already (no call); else it is fetched (KMS: `GetPublicKey`). The execute
    /// function and `airlock serve` call it at start; nothing else needs the key.
    pub async fn preload(&self) -> Result<(), String> {
        let loaded = self
            .load()
            .await
            .map_err(|_| "could not load the confirmation-token public key".to_string())?;
        tracing::info!(
            kid = %self.kid,
            key_thumbprint = %jwk_thumbprint(&loaded.public),
            key_source = self.origin.describe(),
            "confirmation-token public key loaded"
        );
        Ok(())
    }

    async fn load(&self) -> Result<&Loaded, TokenFault> {
        self.keys
            .get_or_try_init(|| async {
                // A configured key is loaded at construction; never fetched, never a panic.
                let KeyOrigin::Signer(signer) = &self.origin else {
                    return Err(crate::core::error::StoreError::Unavailable(
                        "the configured confirmation key was not loaded".into(),
                    ));
                };
                let public = signer.public_key().await?;
                Ok::<_, crate::core::error::StoreError>(Self::loaded(
                    &self.audience,
                    &self.kid,
                    public,
                ))
            })
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "could not load the confirmation public key");
                TokenFault::Unavailable
            })
    }

    /// Remembers `token`, just signed with `claims` by this process, so that its execute in
    /// the same process skips the ES256 check (about 8 % of a plan and execute's CPU on the
    /// embedded server). Only where the check could not answer otherwise: the verifier's
    /// key is its signer's (not configured: a configured key that is not the signer's must
    /// go on refusing every token), and the claims name this verifier's issuer and
    /// audience. The token's exact bytes are the key: a token changed in any byte is not
    /// found and is checked in full. Nothing else writes here, so an agent cannot add a
    /// token; a Lambda that did not sign the token checks it in full, as before.
    pub fn issued(&self, token: &str, claims: &ConfirmationClaims) {
        if matches!(self.origin, KeyOrigin::Signer(_))
            && claims.iss == CONFIRMATION_ISSUER
            && claims.aud == self.audience
        {
            self.issued.put(token, claims, claims.exp);
        }
    }

    /// Signature, algorithm (ES256 only), key id, issuer, audience and expiry (no skew:
    /// Airlock issued it on its own clock). A token this process signed ([`Self::issued`])
    /// needs no signature check; its times are checked as any token's, and one out of
    /// time is checked in full, so the refusal is the same.
    pub async fn verify(&self, token: &str, now_s: i64) -> Result<ConfirmationClaims, TokenFault> {
        if let Some(c) = self.issued.get(token, now_s, 0) {
            if c.iat <= now_s && c.iat <= c.exp {
                return Ok(c);
            }
        }
        let loaded = self.load().await?;
        let claims = match verify_jwt(token, &loaded.issuer, now_s, 0).await {
            Ok(c) => c,
            Err(fault) => {
                if matches!(fault, TokenFault::Invalid(_)) {
                    self.explain(token, &loaded.public);
                }
                return Err(fault);
            }
        };
        serde_json::from_value(claims)
            .map_err(|_| TokenFault::Invalid("the token's claims have the wrong shape".into()))
    }

    /// Logs why a refused token's key did not fit, when that is why: a `kid` other than the
    /// signer's, or a signature the key does not verify. A configured key that is not the
    /// signer's refuses every token with the second (after a key rotation, say). Logs key
    /// ids and the key's thumbprint (RFC 7638), never the token.
    fn explain(&self, token: &str, public: &p256::PublicKey) {
        let Ok(header) = jsonwebtoken::decode_header(token) else {
            return; // not a JWT at all: the answer says so
        };
        let thumbprint = jwk_thumbprint(public);
        let source = self.origin.describe();
        if header.kid.as_deref() != Some(self.kid.as_str()) {
            tracing::warn!(
                token_kid = header.kid.as_deref().unwrap_or("(none)"),
                expected_kid = %self.kid,
                key_source = source,
                key_thumbprint = %thumbprint,
                "confirmation token refused: kid mismatch (the token names another signing \
                 key than this function's AIRLOCK_SIGNING_KEY_ID)"
            );
        } else if header.alg == jsonwebtoken::Algorithm::ES256 && !signature_verifies(token, public)
        {
            let hint = match self.origin {
                KeyOrigin::Configured => {
                    "; if every token fails so, AIRLOCK_CONFIRMATION_PUBLIC_KEY is not the \
                     signing key's public key (a rotated key?): set it again from `airlock \
                     confirmation-key`"
                }
                KeyOrigin::Signer(_) => "",
            };
            tracing::warn!(
                kid = %self.kid,
                key_source = source,
                key_thumbprint = %thumbprint,
                "confirmation token refused: key mismatch, its signature does not verify with \
                 the public key of its kid{hint}"
            );
        }
    }
}

/// Whether the compact JWS `token`'s ES256 signature verifies with `public`.
fn signature_verifies(token: &str, public: &p256::PublicKey) -> bool {
    use p256::ecdsa::signature::Verifier;
    let Some((input, sig)) = token.rsplit_once('.') else {
        return false;
    };
    let Ok(sig) = B64.decode(sig) else {
        return false;
    };
    let Ok(sig) = p256::ecdsa::Signature::from_slice(&sig) else {
        return false;
    };
    p256::ecdsa::VerifyingKey::from(public)
        .verify(input.as_bytes(), &sig)
        .is_ok()
}

/// The RFC 7638 JWK thumbprint of a P-256 public key (base64url SHA-256 of its canonical
/// JWK): a short name for a key in logs and in `airlock confirmation-key`'s output.
pub fn jwk_thumbprint(public: &p256::PublicKey) -> String {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use sha2::Digest;
    let point = public.to_encoded_point(false);
    let coord = |c: Option<&p256::FieldBytes>| B64.encode(c.map(|c| &c[..]).unwrap_or_default());
    let jwk = format!(
        r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
        coord(point.x()),
        coord(point.y())
    );
    B64.encode(sha2::Sha256::digest(jwk.as_bytes()))
}

/// A P-256 public key as configured: the PEM `airlock confirmation-key` prints
/// (SubjectPublicKeyInfo, `-----BEGIN PUBLIC KEY-----`), with its line breaks or without
/// them (also written as `\n`), or the PEM's base64 body alone (DER), which fits on one
/// line in a deploy parameter. Errors say what is wrong without quoting the value.
pub fn parse_public_key(text: &str) -> Result<p256::PublicKey, String> {
    use p256::pkcs8::DecodePublicKey;
    const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
    const END: &str = "-----END PUBLIC KEY-----";
    let text = text.replace("\\n", "\n");
    let text = text.trim();
    if text.contains("PRIVATE KEY") {
        return Err(
            "this is a private key; give the public key (`airlock confirmation-key` \
                    prints it)"
                .into(),
        );
    }
    let body = match text.strip_prefix(BEGIN) {
        Some(rest) => rest
            .trim_end()
            .strip_suffix(END)
            .ok_or(format!("a PEM public key ends with {END}"))?,
        None if text.starts_with("-----") => {
            return Err(format!(
                "not a PEM public key (SubjectPublicKeyInfo, {BEGIN}), such as \
                 `airlock confirmation-key` prints"
            ))
        }
        None => text,
    };
    let b64: String = body.chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| {
            format!(
                "not a public key: expected the PEM `airlock confirmation-key` prints ({BEGIN} \
                 ...), or its base64 body"
            )
        })?;
    p256::PublicKey::from_public_key_der(&der).map_err(|_| {
        "not a P-256 (ECC_NIST_P256) public key in SubjectPublicKeyInfo form, as \
         `airlock confirmation-key` prints"
            .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::local_signer::LocalSigner;
    use base64::engine::general_purpose::STANDARD as B64STD;
    use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};

    fn claims(now: i64) -> ConfirmationClaims {
        ConfirmationClaims {
            iss: CONFIRMATION_ISSUER.into(),
            aud: "airlock-execute".into(),
            sub: "mastra".into(),
            plan_id: "pln_1".into(),
            payload_hash: "00".into(),
            requested_by: "op".into(),
            iat: now,
            exp: now + 300,
            jti: "j".into(),
        }
    }

    fn key() -> p256::SecretKey {
        p256::SecretKey::random(&mut rand::rngs::OsRng)
    }

    fn pem(k: &p256::SecretKey) -> String {
        k.public_key().to_public_key_pem(LineEnding::LF).unwrap()
    }

    #[test]
    fn the_forms_of_a_configured_key() {
        let k = key();
        let pem = pem(&k);
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        for form in [
            pem.clone(),
            pem.replace('\n', ""),
            pem.replace('\n', "\\n"),
            pem.replace('\n', "\r\n"),
            format!("  {}  ", pem.trim()),
            body.clone(),
        ] {
            assert_eq!(parse_public_key(&form), Ok(k.public_key()), "{form:?}");
        }
        let private = k.to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
        let refused = [
            ("", "not a P-256"),
            ("not a key", "not a public key"),
            (&body[..body.len() - 8], "not a"),
            (&private, "this is a private key"),
            (&pem.replace("-----END PUBLIC KEY-----", ""), "ends with"),
            (
                "-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----",
                "not a PEM public key",
            ),
        ];
        for (form, why) in refused {
            let e = parse_public_key(form).expect_err(form);
            assert!(e.contains(why), "{form:?}: {e}");
            assert!(!e.contains(&body[..20]), "the error quotes the value: {e}");
        }
        // An EC key on another curve is not a confirmation key: the curve OID
        // (1.2.840.10045.3.1.7, prime256v1) changed to 1.2.840.10045.3.1.6.
        let mut der = B64STD.decode(&body).unwrap();
        let oid = [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
        let at = der.windows(oid.len()).position(|w| w == oid).unwrap();
        der[at + oid.len() - 1] = 0x06;
        let e = parse_public_key(&B64STD.encode(der)).expect_err("another curve");
        assert!(e.contains("not a P-256"), "{e}");
    }

    #[test]
    fn the_thumbprint_is_rfc_7638s() {
        // The P-256 key of RFC 7515 A.3; the expected value was computed apart from this
        // code (SHA-256 of the RFC 7638 canonical JWK, with Python's hashlib).
        use p256::elliptic_curve::sec1::EncodedPoint;
        let x = B64
            .decode("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU")
            .unwrap();
        let y = B64
            .decode("x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0")
            .unwrap();
        let point = EncodedPoint::<p256::NistP256>::from_affine_coordinates(
            x.as_slice().into(),
            y.as_slice().into(),
            false,
        );
        let public = p256::PublicKey::from_sec1_bytes(point.as_bytes()).unwrap();
        assert_eq!(
            jwk_thumbprint(&public),
            "oKIywvGUpTVTyxMQ3bwIIeQUudfr_CkLMjCE19ECD-U"
        );
    }

    #[tokio::test]
    async fn a_configured_key_verifies_its_signers_tokens_and_only_those() {
        let (k, other) = (key(), key());
        let signer = LocalSigner::new("kid-1", &k).unwrap();
        let now = 1_000_000;
        let token = sign(&signer, &claims(now)).await.unwrap();

        let right =
            ConfirmationVerifier::with_public_key("airlock-execute", "kid-1", &k.public_key());
        assert!(right.is_configured());
        right.preload().await.unwrap();
        assert_eq!(right.verify(&token, now).await, Ok(claims(now)));

        // Another key under the same kid (a stale key after a rotation): refused.
        let wrong =
            ConfirmationVerifier::with_public_key("airlock-execute", "kid-1", &other.public_key());
        assert!(!signature_verifies(&token, &other.public_key()));
        assert!(signature_verifies(&token, &k.public_key()));
        assert_eq!(
            wrong.verify(&token, now).await,
            Err(TokenFault::Invalid(
                "the token's signature does not verify".into()
            ))
        );
        // The right key under another kid: refused too.
        let renamed =
            ConfirmationVerifier::with_public_key("airlock-execute", "kid-2", &k.public_key());
        assert_eq!(
            renamed.verify(&token, now).await,
            Err(TokenFault::Invalid(
                "the token's signing key (kid) is unknown".into()
            ))
        );
        // The same answers as a verifier that asks the signer.
        let fetched = ConfirmationVerifier::new("airlock-execute", Arc::new(signer));
        assert!(!fetched.is_configured());
        assert_eq!(fetched.verify(&token, now).await, Ok(claims(now)));
    }

    /// A signer that signs but cannot give its public key (KMS unreachable, say): a
    /// verifier built on it can only answer from what its process signed.
    struct NoPublicKey(LocalSigner);

    #[async_trait::async_trait]
    impl Signer for NoPublicKey {
        fn key_id(&self) -> &str {
            self.0.key_id()
        }
        async fn public_key(&self) -> crate::core::error::StoreResult<p256::PublicKey> {
            Err(crate::core::error::StoreError::Unavailable(
                "no key today".into(),
            ))
        }
        async fn sign(&self, message: &[u8]) -> crate::core::error::StoreResult<[u8; 64]> {
            self.0.sign(message).await
        }
    }

    #[tokio::test]
    async fn a_token_this_process_signed_skips_only_the_signature_check() {
        let k = key();
        let now = 1_000_000;
        let signer = Arc::new(NoPublicKey(LocalSigner::new("kid-1", &k).unwrap()));
        let verifier = ConfirmationVerifier::new("airlock-execute", signer.clone());
        let token = sign(signer.as_ref(), &claims(now)).await.unwrap();
        // Not told: the full check, which needs the key.
        assert_eq!(
            verifier.verify(&token, now).await,
            Err(TokenFault::Unavailable)
        );
        verifier.issued(&token, &claims(now));
        assert_eq!(verifier.verify(&token, now).await, Ok(claims(now)));
        assert_eq!(verifier.verify(&token, now + 300).await, Ok(claims(now)));
        // Any other bytes are checked in full: a changed signature, a changed claim, the
        // same claims signed again (another token).
        let (input, sig) = token.rsplit_once('.').unwrap();
        let flipped = if sig.starts_with('A') { 'B' } else { 'A' };
        let resigned = sign(signer.as_ref(), &claims(now)).await.unwrap();
        assert_ne!(resigned, token);
        for other in [
            format!("{input}.{flipped}{}", &sig[1..]),
            token.replacen('.', ".e", 1),
            resigned,
        ] {
            assert_eq!(
                verifier.verify(&other, now).await,
                Err(TokenFault::Unavailable)
            );
        }
        // Out of time (expired, or issued after now): checked in full too.
        assert_eq!(
            verifier.verify(&token, now + 301).await,
            Err(TokenFault::Unavailable)
        );
        assert_eq!(
            verifier.verify(&token, now - 1).await,
            Err(TokenFault::Unavailable)
        );
    }

    #[tokio::test]
    async fn a_remembered_token_gets_the_same_answers_as_a_checked_one() {
        let k = key();
        let now = 1_000_000;
        let signer = Arc::new(LocalSigner::new("kid-1", &k).unwrap());
        let token = sign(signer.as_ref(), &claims(now)).await.unwrap();
        let told = ConfirmationVerifier::new("airlock-execute", signer.clone());
        told.issued(&token, &claims(now));
        let checked = ConfirmationVerifier::new("airlock-execute", signer.clone());
        for at in [now - 1, now, now + 300, now + 301] {
            assert_eq!(
                told.verify(&token, at).await,
                checked.verify(&token, at).await,
                "at {at}"
            );
        }
        assert_eq!(
            told.verify(&token, now + 301).await,
            Err(TokenFault::Expired(now + 300))
        );

        // Claims for another audience or issuer are not remembered: the full check
        // refuses them as before.
        let other_aud = ConfirmationClaims {
            aud: "someone-else".into(),
            ..claims(now)
        };
        let t = sign(signer.as_ref(), &other_aud).await.unwrap();
        told.issued(&t, &other_aud);
        assert_eq!(told.verify(&t, now).await, checked.verify(&t, now).await);
        assert!(told.verify(&t, now).await.is_err());

        // A configured key that is not the signer's goes on refusing every token, even
        // one its process signed and told it of.
        let wrong =
            ConfirmationVerifier::with_public_key("airlock-execute", "kid-1", &key().public_key());
        wrong.issued(&token, &claims(now));
        assert_eq!(
            wrong.verify(&token, now).await,
            Err(TokenFault::Invalid(
                "the token's signature does not verify".into()
            ))
        );
    }
}
