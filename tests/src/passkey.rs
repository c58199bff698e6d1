//! A software passkey (a WebAuthn authenticator: P-256, `none` attestation, user verified)
//! and an approval-page client that drives the server's ceremonies over plain HTTP. The
//! browser suite proves the page itself with Chromium's virtual authenticator; this one
//! lets the attacker tests forge, replay and cross assertions precisely, on both backends.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{DerSignature, SigningKey};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn cbor_head(major: u8, len: u64) -> Vec<u8> {
    let m = major << 5;
    match len {
        0..=23 => vec![m | len as u8],
        24..=0xff => vec![m | 24, len as u8],
        0x100..=0xffff => {
            let mut v = vec![m | 25];
            v.extend_from_slice(&(len as u16).to_be_bytes());
            v
        }
        _ => {
            let mut v = vec![m | 26];
            v.extend_from_slice(&(len as u32).to_be_bytes());
            v
        }
    }
}

fn cbor_int(i: i64) -> Vec<u8> {
    if i >= 0 {
        cbor_head(0, i as u64)
    } else {
        cbor_head(1, (-1 - i) as u64)
    }
}

fn cbor_bytes(b: &[u8]) -> Vec<u8> {
    let mut v = cbor_head(2, b.len() as u64);
    v.extend_from_slice(b);
    v
}

fn cbor_text(s: &str) -> Vec<u8> {
    let mut v = cbor_head(3, s.len() as u64);
    v.extend_from_slice(s.as_bytes());
    v
}

/// A passkey held in software.
pub struct Passkey {
    key: SigningKey,
    pub credential_id: Vec<u8>,
    pub user_handle: Option<Vec<u8>>,
    pub counter: u32,
    /// The user-verified flag this authenticator reports.
    pub user_verified: bool,
}

impl Default for Passkey {
    fn default() -> Self {
        Passkey::new()
    }
}

impl Passkey {
    pub fn new() -> Passkey {
        use rand::RngCore;
        let mut id = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut id);
        Passkey {
            key: SigningKey::random(&mut rand::rngs::OsRng),
            credential_id: id.to_vec(),
            user_handle: None,
            counter: 0,
            user_verified: true,
        }
    }

    pub fn id(&self) -> String {
        B64.encode(&self.credential_id)
    }

    fn flags(&self, attested: bool) -> u8 {
        let mut f = 0x01; // user present
        if self.user_verified {
            f |= 0x04;
        }
        if attested {
            f |= 0x40;
        }
        f
    }

    fn client_data(kind: &str, challenge: &str, origin: &str) -> Vec<u8> {
        json!({ "type": kind, "challenge": challenge, "origin": origin, "crossOrigin": false })
            .to_string()
            .into_bytes()
    }

    /// `navigator.credentials.create` for the server's creation options.
    pub fn register(&mut self, options: &Value, origin: &str) -> Value {
        let pk = &options["publicKey"];
        let rp_id = pk["rp"]["id"].as_str().expect("rp id");
        let challenge = pk["challenge"].as_str().expect("challenge");
        self.user_handle = pk["user"]["id"]
            .as_str()
            .map(|u| B64.decode(u).expect("user id"));
        let point = self.key.verifying_key().to_encoded_point(false);
        let mut cose = cbor_head(5, 5);
        for (k, v) in [(1, cbor_int(2)), (3, cbor_int(-7)), (-1, cbor_int(1))] {
            cose.extend(cbor_int(k));
            cose.extend(v);
        }
        cose.extend(cbor_int(-2));
        cose.extend(cbor_bytes(point.x().expect("x")));
        cose.extend(cbor_int(-3));
        cose.extend(cbor_bytes(point.y().expect("y")));
        let mut auth = Sha256::digest(rp_id.as_bytes()).to_vec();
        auth.push(self.flags(true));
        auth.extend_from_slice(&self.counter.to_be_bytes());
        auth.extend_from_slice(&[0u8; 16]);
        auth.extend_from_slice(&(self.credential_id.len() as u16).to_be_bytes());
        auth.extend_from_slice(&self.credential_id);
        auth.extend(cose);
        let mut att = cbor_head(5, 3);
        att.extend(cbor_text("fmt"));
        att.extend(cbor_text("none"));
        att.extend(cbor_text("attStmt"));
        att.extend(cbor_head(5, 0));
        att.extend(cbor_text("authData"));
        att.extend(cbor_bytes(&auth));
        json!({
            "id": self.id(),
            "rawId": self.id(),
            "type": "public-key",
            "response": {
                "attestationObject": B64.encode(att),
                "clientDataJSON": B64.encode(Self::client_data("webauthn.create", challenge, origin)),
            },
            "extensions": {},
        })
    }

    /// `navigator.credentials.get` for the server's request options (any challenge given
    /// explicitly, so tests can answer the wrong one).
    pub fn assert_challenge(&mut self, rp_id: &str, challenge: &str, origin: &str) -> Value {
        self.counter += 1;
        let mut auth = Sha256::digest(rp_id.as_bytes()).to_vec();
        auth.push(self.flags(false));
        auth.extend_from_slice(&self.counter.to_be_bytes());
        let client = Self::client_data("webauthn.get", challenge, origin);
        let mut signed = auth.clone();
        signed.extend_from_slice(&Sha256::digest(&client));
        let sig: DerSignature = self.key.sign(&signed);
        json!({
            "id": self.id(),
            "rawId": self.id(),
            "type": "public-key",
            "response": {
                "authenticatorData": B64.encode(&auth),
                "clientDataJSON": B64.encode(&client),
                "signature": B64.encode(sig.as_bytes()),
                "userHandle": self.user_handle.as_ref().map(|u| B64.encode(u)),
            },
            "extensions": {},
        })
    }

    pub fn assert(&mut self, options: &Value, origin: &str) -> Value {
        let pk = &options["publicKey"];
        let rp_id = pk["rpId"].as_str().expect("rpId");
        let challenge = pk["challenge"].as_str().expect("challenge").to_string();
        self.assert_challenge(rp_id, &challenge, origin)
    }
}

/// The approval page's origin of a server (`http://localhost:PORT`; a WebAuthn relying
/// party needs a host name, and `localhost` is a secure context).
pub fn origin_of(s: &crate::Server) -> String {
    let port = s.base.rsplit(':').next().expect("port");
    format!("http://localhost:{port}")
}

/// `airlock operators enroll` for this server: the one-time link it prints.
pub fn enroll(s: &crate::Server, sub: &str, roles: &str, desks: &str) -> String {
    let o = origin_of(s);
    let mut env = s.cli_env();
    env.push(("AIRLOCK_APPROVAL_ORIGIN".into(), o.clone()));
    let args = [
        "operators",
        "enroll",
        "--sub",
        sub,
        "--roles",
        roles,
        "--desks",
        desks,
    ];
    let url = crate::cli(&s.state_dir, &env, &args).trim().to_string();
    assert!(
        url.starts_with(&format!("{o}/approvals/enroll/")),
        "enrolment link {url:?}"
    );
    url
}

/// The approval page, spoken to over HTTP as its script does.
pub struct ApprovalClient {
    /// Where requests go (`http://127.0.0.1:PORT`).
    pub base: String,
    /// The page's origin (`http://localhost:PORT`), sent as `Origin` and signed in client data.
    pub origin: String,
    pub http: reqwest::Client,
    pub cookie: Option<String>,
    pub csrf: Option<String>,
}

/// An answer: status and JSON body (or the text, under `"text"`).
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl ApprovalClient {
    pub fn new(base: &str) -> ApprovalClient {
        let port = base.rsplit(':').next().expect("port");
        ApprovalClient {
            base: base.to_string(),
            origin: format!("http://localhost:{port}"),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client"),
            cookie: None,
            csrf: None,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let mut req = req;
        if let Some(c) = &self.cookie {
            req = req.header("cookie", format!("airlock_approvals={c}"));
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text }));
        Answer {
            status,
            body,
            headers,
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// A POST as the page sends it: same-origin, with the anti-forgery token if known.
    pub async fn post(&self, path: &str, body: Value) -> Answer {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("origin", &self.origin)
            .json(&body);
        if let Some(t) = &self.csrf {
            req = req.header("x-csrf-token", t);
        }
        self.send(req).await
    }

    fn take_cookie(&mut self, a: &Answer) {
        let set = a
            .headers
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .expect("set-cookie");
        let value = set
            .split(';')
            .next()
            .and_then(|kv| kv.split_once('='))
            .map(|(_, v)| v.to_string())
            .expect("cookie value");
        self.cookie = Some(value);
    }

    /// Reads the anti-forgery token of a page.
    pub async fn load_csrf(&mut self, path: &str) -> Answer {
        let a = self.get(path).await;
        let text = a.body["text"].as_str().unwrap_or_default();
        self.csrf = text
            .split("name=\"csrf-token\" content=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(String::from);
        a
    }

    /// Opens an enrolment link and registers `key`; signs in.
    pub async fn enroll(&mut self, url: &str, key: &mut Passkey) -> Answer {
        let path = url.split_once("/approvals/").map(|(_, p)| p).expect("link");
        let path = format!("/approvals/{path}");
        let start = self.post(&format!("{path}/start"), json!({})).await;
        assert_eq!(start.status, 200, "enrol start: {}", start.body);
        let cred = key.register(&start.body["options"], &self.origin);
        let done = self
            .post(
                &format!("{path}/finish"),
                json!({ "challenge_id": start.body["challenge_id"], "credential": cred }),
            )
            .await;
        if done.status == 200 {
            self.take_cookie(&done);
        }
        done
    }

    /// Signs in with `key`.
    pub async fn sign_in(&mut self, sub: &str, key: &mut Passkey) -> Answer {
        let start = self
            .post("/approvals/login/start", json!({ "operator_id": sub }))
            .await;
        if start.status != 200 {
            return start;
        }
        let cred = key.assert(&start.body["options"], &self.origin);
        let done = self
            .post(
                "/approvals/login/finish",
                json!({ "challenge_id": start.body["challenge_id"], "credential": cred }),
            )
            .await;
        if done.status == 200 {
            self.take_cookie(&done);
        }
        done
    }

    /// Starts a decision (`approved` or `declined`) on a plan: the ceremony's options.
    pub async fn start(&mut self, plan_id: &str, decision: &str) -> Answer {
        self.load_csrf(&format!("/approvals/plans/{plan_id}")).await;
        self.post(
            &format!("/approvals/plans/{plan_id}/start"),
            json!({ "decision": decision }),
        )
        .await
    }

    pub async fn finish(&self, plan_id: &str, challenge_id: &Value, credential: Value) -> Answer {
        self.post(
            &format!("/approvals/plans/{plan_id}/finish"),
            json!({ "challenge_id": challenge_id, "credential": credential }),
        )
        .await
    }

    /// Approves or declines a plan with `key`.
    pub async fn decide(&mut self, plan_id: &str, decision: &str, key: &mut Passkey) -> Answer {
        let start = self.start(plan_id, decision).await;
        if start.status != 200 {
            return start;
        }
        let cred = key.assert(&start.body["options"], &self.origin);
        self.finish(plan_id, &start.body["challenge_id"], cred)
            .await
    }
}
