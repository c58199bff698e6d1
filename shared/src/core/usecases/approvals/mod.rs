//! Operator approval: the human confirmation the agent cannot forge.
//!
//! An `operator`-mode plan is approved or declined on Airlock's own page by a person signed
//! in with a passkey; the agent never holds what it takes. This use case owns every
//! decision of that channel, on both backends:
//!
//! - **Enrolment** out of the agent's reach: an admin creates a one-time link
//!   (`airlock operators enroll`, or the admin-only API) that registers one passkey for one
//!   operator (`sub`, roles, desks). Holding an operator token is not enough.
//! - **Sign-in**: a passkey assertion (user verification required) opens a short-lived
//!   session (an `HttpOnly`, `SameSite=Strict` cookie whose SHA-256 is the session's id)
//!   with its own anti-forgery token.
//! - **Decisions**: approving or declining is a fresh passkey assertion whose challenge is
//!   stored bound to the plan id, its payload hash, the decision and the operator, and is
//!   taken (deleted) by the first attempt to use it: an assertion for another plan's
//!   challenge, a replayed assertion, or a plan whose payload changed is refused. The
//!   decision is written on the plan only while it is planned, undecided and unexpired.
//! - **Four eyes**: above the policy's notional, the approver must be another operator with
//!   `approve` on the plan's desk; the requester's own approval is refused.
//!
//! Approvals, declines and refusals are audited with the approver, the credential id, the
//! user-verified flag and the time.

use std::sync::Arc;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use webauthn_rs::prelude::{
    CreationChallengeResponse, Passkey, PasskeyAuthentication, PasskeyRegistration,
    PublicKeyCredential, RegisterPublicKeyCredential, RequestChallengeResponse, Url, Uuid,
    Webauthn, WebauthnBuilder,
};

use crate::core::auth::{DeskScope, Permission, RoleTable};
use crate::core::clock::SharedClock;
use crate::core::domain::{human_time, new_id, Millis};
use crate::core::error::{ApiError, Code};
use crate::core::ports::{ApprovalStore, AuditLog, Doc, DocKind, PlanStore};
use crate::core::records::{
    Approval, ApprovalChange, ApprovalDecision, AuditRecord, PlanPosition, PlanRecord,
};

mod ceremonies;
mod decisions;
mod operators;
pub mod summary;

/// How long a WebAuthn ceremony (its challenge) may take.
pub const CHALLENGE_TTL_MS: Millis = 5 * 60 * 1000;
/// Longest and default life of an enrolment link.
pub const MAX_ENROLMENT_TTL_S: u32 = 7 * 24 * 3600;
pub const DEFAULT_ENROLMENT_TTL_S: u32 = 24 * 3600;
/// The cookie that carries a sign-in session's secret.
pub const SESSION_COOKIE: &str = "airlock_approvals";
/// The scope sign-in tickets are sealed under (the server's MAC key also seals cursors).
const SIGN_IN_SCOPE: &str = "approvals-sign-in";
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The audit trail of an operator's lifecycle (`airlock audit operator:<sub>`).
pub fn operator_trail(sub: &str) -> String {
    format!("operator:{sub}")
}

/// A challenge id derived from what the ceremony is for, so starting it again replaces the
/// earlier challenge instead of adding one (hex, as `check_token` accepts).
fn derived_id(purpose: &str, parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(purpose.as_bytes());
    for p in parts {
        h.update([0u8]);
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// An operator who approves with passkeys. Roles and desks are set by the admin who
/// enrols them; the role table gives their permissions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorDoc {
    pub sub: String,
    pub roles: Vec<String>,
    pub desks: Vec<String>,
    /// WebAuthn user handle (random, not the `sub`).
    pub user_id: Uuid,
    pub credentials: Vec<Passkey>,
    /// Revoked operators cannot sign in.
    pub revoked_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub updated_by: String,
    /// The one enrolment link that may still register a passkey. Issuing a new link
    /// replaces it, revoking the operator or using it closes it: a link not named here is
    /// dead, whatever its own document says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_link: Option<OpenLink>,
    /// Bumped by every revocation. A session lives only while its epoch is the operator's,
    /// so a session opened before a revocation stays dead after a re-enrolment.
    #[serde(default)]
    pub session_epoch: u64,
}

/// An enrolment link not used yet: its id (the SHA-256 of its secret, never the secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenLink {
    pub id: String,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub created_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct EnrolmentDoc {
    sub: String,
    created_by: String,
    created_at: Millis,
}

/// A sign-in ceremony, held by the browser between its two requests (sealed with the
/// server's MAC key, so nothing is stored for a request that has not signed in yet).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SignInTicket {
    /// The operator id typed on the page.
    s: String,
    /// The challenge the passkey signs (base64url).
    c: String,
    /// Expiry (millis).
    e: Millis,
}

/// What a ceremony is for: bound at its start, checked at its finish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "purpose", rename_all = "snake_case")]
enum Purpose {
    Register {
        enrolment: String,
    },
    SignIn,
    Decide {
        plan_id: String,
        payload_hash: String,
        decision: ApprovalDecision,
        session: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChallengeDoc {
    sub: String,
    #[serde(flatten)]
    purpose: Purpose,
    /// `PasskeyRegistration` or `PasskeyAuthentication`, kept server side only.
    state: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SessionDoc {
    sub: String,
    csrf: String,
    created_at: Millis,
    /// The operator's `session_epoch` when the session opened.
    #[serde(default)]
    epoch: u64,
}

/// A signed-in operator, as the approval page sees them.
#[derive(Debug, Clone)]
pub struct SignedIn {
    pub operator: OperatorDoc,
    /// The session's id (SHA-256 of the cookie's secret).
    pub session_id: String,
    /// The anti-forgery token every state-changing request must carry.
    pub csrf: String,
    pub expires_at: Millis,
}

/// A new session: the cookie's secret and how long it lasts.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub secret: String,
    pub max_age_s: u32,
}

/// A ceremony's options for the browser, with the id to finish it under.
#[derive(Debug, Clone, Serialize)]
pub struct Ceremony<T> {
    pub challenge_id: String,
    pub options: T,
}

/// What a signed-in operator may do with a plan, and why not.
#[derive(Debug, Clone)]
pub struct PlanPage {
    pub plan: PlanRecord,
    /// `Ok` when this operator may approve it now; else the sentence why not.
    pub approve: Result<(), String>,
    pub decline: Result<(), String>,
}

/// A page of an operator's pending list, and where the next page starts.
#[derive(Debug, Clone)]
pub struct PendingPage {
    pub plans: Vec<PlanRecord>,
    pub next: Option<PlanPosition>,
}

/// One line of the operator's enrolment listing.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorSummary {
    pub sub: String,
    pub roles: Vec<String>,
    pub desks: Vec<String>,
    pub passkeys: usize,
    pub revoked: bool,
    /// When the operator's unused enrolment link expires, if one is open (never the link).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_link_expires_at: Option<String>,
}

/// An enrolment link, as the admin gets it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EnrolmentLink {
    pub sub: String,
    pub url: String,
    pub expires_at: String,
}

/// The approvals use case, built once per process (`app.rs`).
#[derive(Clone)]
pub struct Approvals {
    pub clock: SharedClock,
    /// The relying party; `Err` says why the configured origin cannot serve passkeys.
    pub webauthn: Result<Arc<RelyingParty>, String>,
    /// `AIRLOCK_APPROVAL_ORIGIN`.
    pub origin: String,
    pub session_ttl_s: u32,
    pub roles: RoleTable,
    pub docs: Arc<dyn ApprovalStore>,
    pub plans: Arc<dyn PlanStore>,
    pub audit: Arc<dyn AuditLog>,
    /// Seals sign-in tickets (the server's MAC key, under its own scope).
    pub tickets: crate::core::pagination::CursorCodec,
    /// Believable credential ids for operator ids that have no passkey, so sign-in answers
    /// alike whether the id is enrolled or not (keyed from the server's MAC key).
    pub decoys: Arc<DecoyCredentials>,
}

/// Deterministic, believable credential ids for sign-ins of operator ids that have no
/// passkey (unknown or revoked): the same id always gets the same decoys, and without the
/// key nobody can tell them from real ones. One (mostly) or two ids, of the lengths common
/// authenticators use (16 to 64 bytes).
pub struct DecoyCredentials {
    key: [u8; 32],
}

impl DecoyCredentials {
    pub fn new(key: [u8; 32]) -> Self {
        DecoyCredentials { key }
    }

    fn block(&self, sub: &str, n: u32) -> [u8; 32] {
        use hmac::digest::KeyInit;
        use hmac::Mac;
        // HMAC pads a key shorter than its block with zeros: the 32-byte key, padded to
        // SHA-256's 64-byte block, is the same key, and this constructor cannot fail.
        let mut block_key = [0u8; 64];
        block_key[..32].copy_from_slice(&self.key);
        let mut m = <hmac::Hmac<Sha256> as KeyInit>::new(&block_key.into());
        m.update(&n.to_be_bytes());
        m.update(sub.as_bytes());
        m.finalize().into_bytes().into()
    }

    fn for_sub(&self, sub: &str) -> Vec<Vec<u8>> {
        const LENS: [usize; 4] = [16, 20, 32, 64];
        let head = self.block(sub, 0);
        let count = if head[0].is_multiple_of(5) { 2 } else { 1 };
        (0..count)
            .map(|i| {
                let len = LENS[(head[1 + i] % 4) as usize];
                let mut id = Vec::with_capacity(len);
                let mut k = 1 + 4 * i as u32;
                while id.len() < len {
                    id.extend_from_slice(&self.block(sub, k));
                    k += 1;
                }
                id.truncate(len);
                id
            })
            .collect()
    }
}

/// The passkey relying party and its id.
pub struct RelyingParty {
    pub webauthn: Webauthn,
    pub id: String,
}

/// The relying party for an origin (`https://host[:port]`, or `http://localhost:port`) and
/// an optional relying-party id (default: the origin's host).
pub fn relying_party(origin: &str, rp_id: Option<&str>) -> Result<RelyingParty, String> {
    let url = Url::parse(origin).map_err(|e| format!("approval origin {origin:?}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("approval origin {origin:?} has no host"))?
        .to_string();
    if url.scheme() != "https" && host != "localhost" {
        return Err(format!(
            "approval origin {origin:?} must be https (http only on localhost)"
        ));
    }
    if url.path() != "/" || url.query().is_some() {
        return Err(format!(
            "approval origin {origin:?} must be scheme://host[:port] only"
        ));
    }
    let rp_id = rp_id.map(str::to_string).unwrap_or(host);
    let webauthn = WebauthnBuilder::new(&rp_id, &url)
        .and_then(|b| b.rp_name("Airlock").build())
        .map_err(|e| format!("approval relying party {rp_id:?} for {origin:?}: {e}"))?;
    Ok(RelyingParty {
        webauthn,
        id: rp_id,
    })
}

fn random_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn hash_id(secret: &str) -> String {
    crate::core::digest::sha256_hex(secret.as_bytes())
}

/// Constant-time comparison of two short secrets.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn to_value<T: Serialize>(v: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(v).map_err(|e| ApiError::internal(format!("encoding: {e}")))
}

fn from_doc<T: serde::de::DeserializeOwned>(d: &Doc) -> Result<T, ApiError> {
    serde_json::from_value(d.body.clone())
        .map_err(|e| ApiError::internal(format!("approval document: {e}")))
}

fn passkey_invalid(why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        Code::PasskeyInvalid,
        format!("The passkey check did not pass ({why}); start again from the page."),
    )
}

/// A sub: 1 to 256 printable characters, as `requested_by`.
pub fn check_sub(sub: &str) -> Result<(), ApiError> {
    if sub.is_empty() || sub.chars().count() > 256 || sub.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid(
            "/sub",
            "must be the operator id, 1 to 256 printable characters",
        ));
    }
    Ok(())
}

/// A random id we handed out (a challenge, an enrolment secret): base64url, bounded.
fn check_token(field: &str, v: &str) -> Result<(), ApiError> {
    if v.is_empty()
        || v.len() > 128
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::invalid(field, "is not one Airlock issued"));
    }
    Ok(())
}

impl OperatorDoc {
    fn desk_scope(&self, roles: &RoleTable) -> DeskScope {
        if roles.all_desks(&self.roles) || self.desks.iter().any(|d| d == "*") {
            DeskScope::All
        } else {
            DeskScope::Only(self.desks.iter().cloned().collect())
        }
    }

    fn can(&self, roles: &RoleTable, p: Permission) -> bool {
        roles.permissions(&self.roles).contains(&p)
    }
}

impl Approvals {
    fn rp(&self) -> Result<&Webauthn, ApiError> {
        self.webauthn
            .as_deref()
            .map(|rp| &rp.webauthn)
            .map_err(|why| ApiError::internal(format!("approvals are not configured: {why}")))
    }

    fn rp_id(&self) -> Result<&str, ApiError> {
        self.webauthn
            .as_deref()
            .map(|rp| rp.id.as_str())
            .map_err(|why| ApiError::internal(format!("approvals are not configured: {why}")))
    }

    fn now(&self) -> Millis {
        self.clock.now_ms()
    }

    // ---- Enrolment (admins) -------------------------------------------------------------

    // ---- Sign-in ------------------------------------------------------------------------

    // ---- Plans --------------------------------------------------------------------------
}

fn enrolment_not_found() -> ApiError {
    ApiError::new(
        Code::EnrolmentNotFound,
        "This enrolment link is unknown, used or expired; ask an admin for a new one.",
    )
}

impl ApiError {
    /// The same error under another code (its message and details kept).
    pub fn with_code(mut self, code: Code) -> Self {
        self.code = code;
        self
    }
}

/// Who a four-eyes plan still waits for, in words.
pub fn still_needed(plan: &PlanRecord) -> String {
    let maker = plan.approved_by(&plan.requested_by);
    let checker = plan
        .approvals
        .iter()
        .any(|a| a.approver != plan.requested_by);
    match (maker, checker) {
        (true, true) => "nobody (it is approved)".into(),
        (true, false) => format!(
            "a second operator with approve on desk {} (not {})",
            plan.desk, plan.requested_by
        ),
        (false, true) => format!("{}, who asked for it", plan.requested_by),
        (false, false) => format!(
            "{}, who asked for it, and a second operator with approve on desk {}",
            plan.requested_by, plan.desk
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmac::Mac;

    #[test]
    fn the_padded_block_key_gives_the_same_decoys() {
        let d = DecoyCredentials::new([7u8; 32]);
        let mut m = <hmac::Hmac<Sha256> as Mac>::new_from_slice(&[7u8; 32]).unwrap();
        m.update(&3u32.to_be_bytes());
        m.update(b"op-x");
        let want: [u8; 32] = m.finalize().into_bytes().into();
        assert_eq!(d.block("op-x", 3), want);
    }
}
