//! Signing keys of a production identity provider, fetched from its JWKS URL.
//!
//! - The key set is fetched on first use and cached for `cache_ttl` (default 10 min).
//! - A token whose `kid` is not in the cache triggers one refetch (key rotation: the
//!   provider published a new key), at most once per `refetch_cooldown` (default 30 s), so
//!   a flood of forged `kid`s cannot turn into a flood of fetches. One fetch at a time:
//!   concurrent requests wait for the fetch in flight instead of starting their own.
//! - A refetch replaces the whole set: a key the provider withdrew stops verifying.
//! - If the provider is unreachable when the cache is stale, the last good set keeps
//!   serving for up to `max_stale` (default 24 h), retried at most once per cooldown: an
//!   IdP outage must neither log every operator out nor make every request wait on a
//!   fetch. With no usable set at all, requests fail with 503
//!   `upstream_unavailable`, never with a 401 that blames the caller.
//! - Only keys Airlock may use are kept: EC P-256 for ES256, RSA of at least 2048 bits
//!   for RS256; `use` other than `sig`, other algorithms and symmetric keys are skipped.
//! - The URL must be `https://`, except on a loopback host (tests, a local IdP).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

/// A verification key with the one algorithm it may verify.
#[derive(Clone)]
pub struct VerifyKey {
    pub alg: Algorithm,
    pub key: DecodingKey,
}

/// Keys by `kid`.
#[derive(Clone, Default)]
pub struct KeySet {
    keys: HashMap<String, VerifyKey>,
}

impl KeySet {
    pub fn insert(&mut self, kid: impl Into<String>, alg: Algorithm, key: DecodingKey) {
        self.keys.insert(kid.into(), VerifyKey { alg, key });
    }

    /// The key for a token's `kid`; a token without `kid` only matches a one-key set.
    pub fn get(&self, kid: Option<&str>) -> Option<&VerifyKey> {
        match kid {
            Some(kid) => self.keys.get(kid),
            None if self.keys.len() == 1 => self.keys.values().next(),
            None => None,
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Parses a JWKS document (`{"keys": [...]}`), keeping the keys Airlock may use.
    pub fn from_jwks(json: &[u8]) -> Result<KeySet, String> {
        #[derive(Deserialize)]
        struct Doc {
            keys: Vec<serde_json::Value>,
        }
        let doc: Doc = serde_json::from_slice(json)
            .map_err(|e| format!("the JWKS is not a JSON key set: {e}"))?;
        let mut set = KeySet::default();
        for k in doc.keys {
            let Ok(jwk) = serde_json::from_value::<Jwk>(k) else {
                continue;
            };
            if let Some((kid, key)) = jwk.usable() {
                set.keys.insert(kid, key);
            }
        }
        Ok(set)
    }
}

/// The fields of a JWK that Airlock reads.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    alg: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

/// RSA keys shorter than this are refused (NIST SP 800-131A).
const MIN_RSA_BITS: usize = 2048;

impl Jwk {
    fn usable(&self) -> Option<(String, VerifyKey)> {
        if self.use_.as_deref().is_some_and(|u| u != "sig") {
            return None;
        }
        let kid = self.kid.clone().unwrap_or_default();
        let (alg, key) = match (self.kty.as_str(), self.alg.as_deref()) {
            ("EC", None | Some("ES256")) if self.crv.as_deref() == Some("P-256") => {
                let key =
                    DecodingKey::from_ec_components(self.x.as_deref()?, self.y.as_deref()?).ok()?;
                (Algorithm::ES256, key)
            }
            ("RSA", None | Some("RS256")) => {
                let n = self.n.as_deref()?;
                let modulus = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(n)
                    .ok()?;
                let significant = modulus.iter().skip_while(|b| **b == 0).count();
                if significant * 8 < MIN_RSA_BITS {
                    return None;
                }
                let key = DecodingKey::from_rsa_components(n, self.e.as_deref()?).ok()?;
                (Algorithm::RS256, key)
            }
            _ => return None,
        };
        Some((kid, VerifyKey { alg, key }))
    }
}

/// Fetches a JWKS document. The HTTP implementation is an adapter (`adapters::jwks_http`); unit tests use a fake.
#[async_trait]
pub trait JwksFetcher: Send + Sync {
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String>;
}

/// Why no key could be found for a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyLookup {
    /// The provider's key set holds no key with this `kid`.
    Unknown,
    /// No usable key set: the provider could not be reached (503, not the caller's fault).
    Unavailable(String),
}

#[derive(Debug, Clone, Copy)]
pub struct JwksTiming {
    pub cache_ttl: Duration,
    pub refetch_cooldown: Duration,
    pub max_stale: Duration,
}

impl Default for JwksTiming {
    fn default() -> Self {
        JwksTiming {
            cache_ttl: Duration::from_secs(600),
            refetch_cooldown: Duration::from_secs(30),
            max_stale: Duration::from_secs(24 * 3600),
        }
    }
}

struct Cached {
    keys: Arc<KeySet>,
    fetched_at: Instant,
}

/// One provider's key set, cached.
pub struct JwksCache {
    url: String,
    timing: JwksTiming,
    fetcher: Arc<dyn JwksFetcher>,
    cached: RwLock<Option<Cached>>,
    /// When the last fetch was attempted (success or not), for the refetch cooldown.
    last_attempt: RwLock<Option<Instant>>,
    /// Held while fetching: one fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

impl JwksCache {
    pub fn new(url: impl Into<String>, timing: JwksTiming, fetcher: Arc<dyn JwksFetcher>) -> Self {
        JwksCache {
            url: url.into(),
            timing,
            fetcher,
            cached: RwLock::new(None),
            last_attempt: RwLock::new(None),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn snapshot(&self) -> Option<(Arc<KeySet>, Duration)> {
        let c = self.cached.read().unwrap_or_else(|p| p.into_inner());
        c.as_ref().map(|c| (c.keys.clone(), c.fetched_at.elapsed()))
    }

    fn may_refetch(&self) -> bool {
        match *self.last_attempt.read().unwrap_or_else(|p| p.into_inner()) {
            None => true,
            Some(t) => t.elapsed() >= self.timing.refetch_cooldown,
        }
    }

    /// The key for `kid`, fetching the set when absent, stale, or missing this `kid`.
    pub async fn key(&self, kid: Option<&str>) -> Result<VerifyKey, KeyLookup> {
        if let Some((keys, age)) = self.snapshot() {
            if age < self.timing.cache_ttl {
                if let Some(k) = keys.get(kid) {
                    return Ok(k.clone());
                }
                if !self.may_refetch() {
                    return Err(KeyLookup::Unknown);
                }
            }
        }
        self.refresh(kid).await
    }

    /// What is cached, without fetching: the key if the set is still usable (younger
    /// than `max_stale`), `Unknown` if it lacks this `kid`, `Unavailable` without a set.
    fn cached_key(&self, kid: Option<&str>) -> Result<VerifyKey, KeyLookup> {
        match self.snapshot() {
            Some((keys, age)) if age < self.timing.max_stale => {
                keys.get(kid).cloned().ok_or(KeyLookup::Unknown)
            }
            _ => Err(KeyLookup::Unavailable(
                "no usable key set; the next fetch comes after the cooldown".into(),
            )),
        }
    }

    async fn refresh(&self, kid: Option<&str>) -> Result<VerifyKey, KeyLookup> {
        let before = self.snapshot().map(|(k, _)| k);
        // With a usable set cached, nobody waits on a fetch another request is making:
        // they use the cached set meanwhile (stale-while-revalidate).
        let _guard = match self.fetching.try_lock() {
            Ok(g) => g,
            Err(_) if self.cached_key(kid).is_ok() => return self.cached_key(kid),
            Err(_) => self.fetching.lock().await,
        };
        if let Some((keys, _)) = self.snapshot() {
            if before.as_ref().is_none_or(|b| !Arc::ptr_eq(b, &keys)) {
                // Fetched while this request waited.
                return keys.get(kid).cloned().ok_or(KeyLookup::Unknown);
            }
        }
        // Every fetch, successful or not, is at most once per cooldown: during a provider
        // outage requests use what is cached instead of each making a fetch.
        if !self.may_refetch() {
            return self.cached_key(kid);
        }
        *self.last_attempt.write().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        let fetched = self
            .fetcher
            .fetch(&self.url)
            .await
            .and_then(|body| KeySet::from_jwks(&body));
        match fetched {
            Ok(set) => {
                tracing::info!(jwks_url = %self.url, keys = set.len(), "fetched identity provider keys");
                let keys = Arc::new(set);
                *self.cached.write().unwrap_or_else(|p| p.into_inner()) = Some(Cached {
                    keys: keys.clone(),
                    fetched_at: Instant::now(),
                });
                keys.get(kid).cloned().ok_or(KeyLookup::Unknown)
            }
            Err(why) => {
                tracing::warn!(jwks_url = %self.url, error = %why, "could not fetch identity provider keys");
                self.cached_key(kid)
            }
        }
    }
}

/// Checks a JWKS URL: `https://`, or `http://` on a loopback host only.
pub fn check_url(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|_| "not a URL".to_string())?;
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1") => Ok(()),
        _ => Err("must be an https:// URL (http:// only on a loopback host)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn ec_jwk(kid: &str) -> serde_json::Value {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let sk = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let p = sk.public_key().to_encoded_point(false);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        serde_json::json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
            "x": b64.encode(p.x().unwrap()), "y": b64.encode(p.y().unwrap())})
    }

    fn rsa_jwk(kid: &str, bytes: usize) -> serde_json::Value {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut n = vec![0xC5u8; bytes];
        n[bytes - 1] |= 1;
        serde_json::json!({"kty": "RSA", "kid": kid, "n": b64.encode(n), "e": "AQAB"})
    }

    #[test]
    fn keeps_only_keys_airlock_may_use() {
        let doc = serde_json::json!({"keys": [
            ec_jwk("ec"),
            rsa_jwk("rsa2048", 256),
            rsa_jwk("rsa1024", 128),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": rsa_jwk("x", 256)["n"], "e": "AQAB"},
            {"kty": "RSA", "kid": "rs512", "alg": "RS512", "n": rsa_jwk("x", 256)["n"], "e": "AQAB"},
            {"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"},
            {"kty": "weird"},
            "not even an object"
        ]});
        let set = KeySet::from_jwks(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.get(Some("ec")).unwrap().alg, Algorithm::ES256);
        assert_eq!(set.get(Some("rsa2048")).unwrap().alg, Algorithm::RS256);
        for kid in ["rsa1024", "hmac", "enc", "rs512", "p384"] {
            assert!(set.get(Some(kid)).is_none(), "{kid} must be skipped");
        }
        assert!(set.get(None).is_none(), "no kid matches only a one-key set");
        assert!(KeySet::from_jwks(b"{\"nokeys\": 1}").is_err());
    }

    struct Fake {
        doc: Mutex<Result<serde_json::Value, String>>,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl JwksFetcher for Fake {
        async fn fetch(&self, _url: &str) -> Result<Vec<u8>, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.doc
                .lock()
                .unwrap()
                .clone()
                .map(|d| d.to_string().into_bytes())
        }
    }

    fn cache(doc: serde_json::Value, timing: JwksTiming) -> (Arc<Fake>, JwksCache) {
        let fake = Arc::new(Fake {
            doc: Mutex::new(Ok(doc)),
            calls: AtomicUsize::new(0),
        });
        let c = JwksCache::new("https://idp.example/jwks.json", timing, fake.clone());
        (fake, c)
    }

    #[tokio::test]
    async fn caches_rotates_by_kid_and_rate_limits_refetches() {
        let timing = JwksTiming {
            refetch_cooldown: Duration::from_millis(200),
            ..Default::default()
        };
        let (fake, c) = cache(serde_json::json!({"keys": [ec_jwk("k1")]}), timing);
        for _ in 0..10 {
            assert!(c.key(Some("k1")).await.is_ok());
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1, "cached");

        // Rotation: the provider now publishes k2 only.
        *fake.doc.lock().unwrap() = Ok(serde_json::json!({"keys": [ec_jwk("k2")]}));
        // Within the cooldown an unknown kid does not refetch.
        assert_eq!(c.key(Some("k2")).await.err(), Some(KeyLookup::Unknown));
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(c.key(Some("k2")).await.is_ok(), "refetched on unknown kid");
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
        // The withdrawn key no longer verifies, and forged kids cannot force fetches.
        for _ in 0..50 {
            assert!(c.key(Some("k1")).await.is_err());
            assert!(c.key(Some("forged")).await.is_err());
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn serves_stale_keys_through_an_outage_and_503s_without_any() {
        let timing = JwksTiming {
            cache_ttl: Duration::from_millis(50),
            refetch_cooldown: Duration::ZERO,
            max_stale: Duration::from_secs(60),
        };
        let (fake, c) = cache(serde_json::json!({"keys": [ec_jwk("k1")]}), timing);
        assert!(c.key(Some("k1")).await.is_ok());
        *fake.doc.lock().unwrap() = Err("connection refused".into());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(c.key(Some("k1")).await.is_ok(), "stale set still serves");
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2);

        let (fake2, cold) = cache(serde_json::json!({"keys": []}), timing);
        *fake2.doc.lock().unwrap() = Err("connection refused".into());
        assert!(matches!(
            cold.key(Some("k1")).await,
            Err(KeyLookup::Unavailable(_))
        ));
    }

    #[tokio::test]
    async fn an_outage_costs_one_fetch_per_cooldown_not_one_per_request() {
        let timing = JwksTiming {
            cache_ttl: Duration::from_millis(20),
            refetch_cooldown: Duration::from_secs(60),
            max_stale: Duration::from_secs(60),
        };
        let (fake, c) = cache(serde_json::json!({"keys": [ec_jwk("k1")]}), timing);
        assert!(c.key(Some("k1")).await.is_ok());
        *fake.doc.lock().unwrap() = Err("timeout".into());
        tokio::time::sleep(Duration::from_millis(30)).await;
        for _ in 0..20 {
            assert!(c.key(Some("k1")).await.is_ok(), "stale keys serve");
        }
        assert_eq!(
            fake.calls.load(Ordering::SeqCst),
            1,
            "no refetch inside the cooldown"
        );

        // Cold and down: one attempt, then 503s without waiting on more fetches.
        let (fake, cold) = cache(serde_json::json!({"keys": []}), timing);
        *fake.doc.lock().unwrap() = Err("timeout".into());
        for _ in 0..5 {
            assert!(matches!(
                cold.key(Some("k1")).await,
                Err(KeyLookup::Unavailable(_))
            ));
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn past_max_stale_the_cooldown_still_holds() {
        let timing = JwksTiming {
            cache_ttl: Duration::from_millis(10),
            refetch_cooldown: Duration::from_secs(60),
            max_stale: Duration::from_millis(30),
        };
        let (fake, c) = cache(serde_json::json!({"keys": [ec_jwk("k1")]}), timing);
        assert!(c.key(Some("k1")).await.is_ok());
        *fake.doc.lock().unwrap() = Err("down".into());
        tokio::time::sleep(Duration::from_millis(40)).await;
        for _ in 0..5 {
            assert!(matches!(
                c.key(Some("k1")).await,
                Err(KeyLookup::Unavailable(_))
            ));
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn urls_must_be_https_except_loopback() {
        assert!(check_url(
            "https://cognito-idp.eu-west-1.amazonaws.com/pool/.well-known/jwks.json"
        )
        .is_ok());
        assert!(check_url("http://127.0.0.1:8080/jwks.json").is_ok());
        assert!(check_url("http://localhost/jwks.json").is_ok());
        assert!(check_url("http://idp.example/jwks.json").is_err());
        assert!(check_url("ftp://idp.example/jwks.json").is_err());
        assert!(check_url("not a url").is_err());
    }
}
