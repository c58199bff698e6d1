//! A stand-in identity provider: real RS256 and ES256 keys, tokens signed with them, and a
//! JWKS served over HTTP on a loopback port, so Airlock's production token path (fetch,
//! cache, rotate by `kid`) runs against the real wire format. Stopped on drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{json, Value};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A signing key of the provider.
pub enum Key {
    Rs256 {
        kid: String,
        pair: aws_lc_rs::signature::RsaKeyPair,
    },
    Es256 {
        kid: String,
        key: p256::ecdsa::SigningKey,
    },
}

impl Key {
    pub fn rs256(kid: &str) -> Key {
        let pair = aws_lc_rs::signature::RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048)
            .expect("RSA key generation");
        Key::Rs256 {
            kid: kid.into(),
            pair,
        }
    }

    pub fn es256(kid: &str) -> Key {
        Key::Es256 {
            kid: kid.into(),
            key: p256::ecdsa::SigningKey::random(&mut p256::elliptic_curve::rand_core::OsRng),
        }
    }

    pub fn kid(&self) -> &str {
        match self {
            Key::Rs256 { kid, .. } | Key::Es256 { kid, .. } => kid,
        }
    }

    /// The public key as a JWK, as a provider publishes it.
    pub fn jwk(&self) -> Value {
        match self {
            Key::Rs256 { kid, pair } => {
                use aws_lc_rs::signature::KeyPair;
                let public = pair.public_key();
                json!({
                    "kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
                    "n": B64.encode(public.modulus().big_endian_without_leading_zero()),
                    "e": B64.encode(public.exponent().big_endian_without_leading_zero()),
                })
            }
            Key::Es256 { kid, key } => {
                let point = key.verifying_key().to_encoded_point(false);
                json!({
                    "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                    "x": B64.encode(point.x().expect("x")),
                    "y": B64.encode(point.y().expect("y")),
                })
            }
        }
    }

    /// The RSA public key's DER (PKCS#1), for the "HMAC keyed with the public key" attack.
    pub fn public_der(&self) -> Vec<u8> {
        match self {
            Key::Rs256 { pair, .. } => {
                use aws_lc_rs::signature::KeyPair;
                pair.public_key().as_ref().to_vec()
            }
            Key::Es256 { key, .. } => key
                .verifying_key()
                .to_encoded_point(false)
                .as_bytes()
                .to_vec(),
        }
    }

    /// Signs `claims` under this key's `kid` and algorithm.
    pub fn sign(&self, claims: &Value) -> String {
        let alg = match self {
            Key::Rs256 { .. } => "RS256",
            Key::Es256 { .. } => "ES256",
        };
        self.sign_as(alg, self.kid(), claims)
    }

    /// Signs with this key but any header `alg` and `kid` (for the confusion attacks).
    pub fn sign_as(&self, alg: &str, kid: &str, claims: &Value) -> String {
        let header = json!({ "alg": alg, "typ": "JWT", "kid": kid });
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = match self {
            Key::Rs256 { pair, .. } => {
                let mut sig = vec![0; pair.public_modulus_len()];
                pair.sign(
                    &aws_lc_rs::signature::RSA_PKCS1_SHA256,
                    &aws_lc_rs::rand::SystemRandom::new(),
                    input.as_bytes(),
                    &mut sig,
                )
                .expect("RSA signing");
                sig
            }
            Key::Es256 { key, .. } => {
                use p256::ecdsa::{signature::Signer, Signature};
                let sig: Signature = key.sign(input.as_bytes());
                sig.to_bytes().to_vec()
            }
        };
        format!("{input}.{}", B64.encode(sig))
    }
}

pub fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

struct Published {
    keys: Vec<Value>,
    up: bool,
}

/// The JWKS endpoint: `GET /jwks.json` answers the published keys (or 503 when down).
pub struct Idp {
    pub url: String,
    published: Arc<Mutex<Published>>,
    fetches: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    thread: Option<JoinHandle<()>>,
}

/// The TLS identity of [`Idp::start_tls`]: a certificate for `127.0.0.1` and `localhost`
/// issued by a test CA whose private key was thrown away (`tests/fixtures/tls/README.md`).
pub fn test_ca_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls/ca.pem")
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls");
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .expect("server.pem")
        .collect::<Result<_, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).expect("server.key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("TLS identity"),
    )
}

impl Idp {
    /// The JWKS over plain HTTP on loopback.
    pub fn start(keys: &[&Key]) -> Idp {
        Self::start_with(keys, None)
    }

    /// The JWKS over HTTPS (`https://127.0.0.1:<port>/jwks.json`), as a real provider serves
    /// it; clients trust it through `SSL_CERT_FILE` = [`test_ca_file`].
    pub fn start_tls(keys: &[&Key]) -> Idp {
        Self::start_with(keys, Some(tls_config()))
    }

    fn start_with(keys: &[&Key], tls: Option<Arc<rustls::ServerConfig>>) -> Idp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let published = Arc::new(Mutex::new(Published {
            keys: keys.iter().map(|k| k.jwk()).collect(),
            up: true,
        }));
        let fetches = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, f, s) = (published.clone(), fetches.clone(), stop.clone());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                match &tls {
                    None => serve(conn, &p, &f),
                    Some(cfg) => {
                        let Ok(session) = rustls::ServerConnection::new(cfg.clone()) else {
                            continue;
                        };
                        serve(rustls::StreamOwned::new(session, conn), &p, &f);
                    }
                }
            }
        });
        Idp {
            url: format!("{scheme}://{addr}/jwks.json"),
            published,
            fetches,
            stop,
            addr,
            thread: Some(thread),
        }
    }

    /// Replaces the published key set (a rotation).
    pub fn publish(&self, keys: &[&Key]) {
        self.published.lock().expect("lock").keys = keys.iter().map(|k| k.jwk()).collect();
    }

    /// Makes the endpoint answer 503 (`false`) or the keys (`true`).
    pub fn set_up(&self, up: bool) {
        self.published.lock().expect("lock").up = up;
    }

    /// How many times the key set was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

fn serve(mut conn: impl Read + Write, published: &Mutex<Published>, fetches: &AtomicUsize) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let (status, body) = {
        let p = published.lock().expect("lock");
        if !buf.starts_with(b"GET /jwks.json ") {
            ("404 Not Found", String::new())
        } else if !p.up {
            fetches.fetch_add(1, Ordering::SeqCst);
            ("503 Service Unavailable", String::new())
        } else {
            fetches.fetch_add(1, Ordering::SeqCst);
            ("200 OK", json!({ "keys": p.keys }).to_string())
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.flush();
}

impl Drop for Idp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
