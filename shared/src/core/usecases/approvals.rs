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
        use hmac::Mac;
        let mut m =
            <hmac::Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes any key");
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

    async fn operator(&self, sub: &str) -> Result<Option<(OperatorDoc, u64)>, ApiError> {
        let now = self.now();
        match self.docs.get_doc(DocKind::Operator, sub, now).await? {
            Some(d) => Ok(Some((from_doc(&d)?, d.version))),
            None => Ok(None),
        }
    }

    /// Writes an operator at the version read; `false` when another write came first.
    async fn save_operator(&self, op: &OperatorDoc, version: u64) -> Result<bool, ApiError> {
        let doc = Doc {
            body: to_value(op)?,
            version: version + 1,
            expires_at: None,
        };
        Ok(self
            .docs
            .put_doc(DocKind::Operator, &op.sub, &doc, version, self.now())
            .await?)
    }

    // ---- Enrolment (admins) -------------------------------------------------------------

    /// Creates (or updates the roles and desks of) an operator and a one-time link that
    /// registers one passkey for them. The new link replaces any earlier unused one. `by`:
    /// who asked (audited).
    pub async fn enroll(
        &self,
        sub: &str,
        roles: &[String],
        desks: &[String],
        ttl_s: u32,
        by: &str,
    ) -> Result<EnrolmentLink, ApiError> {
        check_sub(sub)?;
        if !(60..=MAX_ENROLMENT_TTL_S).contains(&ttl_s) {
            return Err(ApiError::invalid(
                "/ttl_seconds",
                format!("must be 60 to {MAX_ENROLMENT_TTL_S} seconds"),
            ));
        }
        for (field, list) in [("/roles", roles), ("/desks", desks)] {
            if list.len() > 64 || list.iter().any(|r| r.is_empty() || r.chars().count() > 128) {
                return Err(ApiError::invalid(
                    field,
                    "must hold at most 64 names of 1 to 128 characters",
                ));
            }
        }
        self.rp()?;
        let now = self.now();
        let secret = random_secret();
        let link = OpenLink {
            id: hash_id(&secret),
            created_at: now,
            expires_at: now + ttl_s as i64 * 1000,
            created_by: by.to_string(),
        };
        // The link's document first: it names the operator, but opens nothing until the
        // operator's record names the link.
        let doc = Doc {
            body: to_value(&EnrolmentDoc {
                sub: sub.to_string(),
                created_by: by.to_string(),
                created_at: now,
            })?,
            version: 1,
            expires_at: Some(link.expires_at),
        };
        self.docs
            .put_doc(DocKind::Enrolment, &link.id, &doc, 0, now)
            .await?;
        for _ in 0..8 {
            let (op, version, decision) = match self.operator(sub).await? {
                Some((mut op, v)) => {
                    let decision = if op.revoked_at.is_some() {
                        // Enrolling a revoked operator again starts them over: no passkey,
                        // and no session from before (also one that an older version,
                        // without epochs, kept across the revocation).
                        op.credentials.clear();
                        op.session_epoch += 1;
                        "re_enrolled"
                    } else {
                        "link_issued"
                    };
                    op.roles = roles.to_vec();
                    op.desks = desks.to_vec();
                    op.revoked_at = None;
                    op.updated_at = now;
                    op.updated_by = by.to_string();
                    (op, v, decision)
                }
                None => (
                    OperatorDoc {
                        sub: sub.to_string(),
                        roles: roles.to_vec(),
                        desks: desks.to_vec(),
                        user_id: Uuid::new_v4(),
                        credentials: Vec::new(),
                        revoked_at: None,
                        created_at: now,
                        updated_at: now,
                        updated_by: by.to_string(),
                        open_link: None,
                        session_epoch: 0,
                    },
                    0,
                    "created",
                ),
            };
            let mut op = op;
            let earlier = op.open_link.replace(link.clone());
            if self.save_operator(&op, version).await? {
                if let Some(earlier) = earlier {
                    self.docs
                        .take_doc(DocKind::Enrolment, &earlier.id, now)
                        .await?;
                }
                let mut audit = self.operator_audit(sub, decision, by);
                audit.reason = Some(format!(
                    "enrolment link for {sub} (roles {}; desks {}) until {}",
                    roles.join(","),
                    desks.join(","),
                    human_time(link.expires_at)
                ));
                self.audit.append(&audit).await?;
                return Ok(EnrolmentLink {
                    sub: sub.to_string(),
                    url: format!(
                        "{}/approvals/enroll/{secret}",
                        self.origin.trim_end_matches('/')
                    ),
                    expires_at: crate::core::domain::rfc3339(link.expires_at),
                });
            }
        }
        Err(ApiError::unavailable(
            "enroll: too many concurrent changes to the operator",
        ))
    }

    /// Every enrolled operator.
    pub async fn list_operators(&self) -> Result<Vec<OperatorSummary>, ApiError> {
        let now = self.now();
        let docs = self.docs.list_docs(DocKind::Operator, now).await?;
        docs.iter()
            .map(|d| {
                let op: OperatorDoc = from_doc(d)?;
                Ok(OperatorSummary {
                    passkeys: op.credentials.len(),
                    revoked: op.revoked_at.is_some(),
                    open_link_expires_at: op
                        .open_link
                        .as_ref()
                        .filter(|l| l.expires_at > now)
                        .map(|l| crate::core::domain::rfc3339(l.expires_at)),
                    sub: op.sub,
                    roles: op.roles,
                    desks: op.desks,
                })
            })
            .collect()
    }

    /// Revokes an operator: their passkeys are forgotten, their unused enrolment link is
    /// closed, and every session they opened so far is dead for good (a later enrolment
    /// does not bring one back). `false`: no such operator.
    pub async fn revoke(&self, sub: &str, by: &str) -> Result<bool, ApiError> {
        for _ in 0..8 {
            let Some((mut op, version)) = self.operator(sub).await? else {
                return Ok(false);
            };
            let now = self.now();
            op.credentials.clear();
            op.revoked_at = Some(now);
            op.session_epoch += 1;
            let link = op.open_link.take();
            op.updated_at = now;
            op.updated_by = by.to_string();
            if self.save_operator(&op, version).await? {
                if let Some(link) = link {
                    self.docs
                        .take_doc(DocKind::Enrolment, &link.id, now)
                        .await?;
                }
                self.audit
                    .append(&self.operator_audit(sub, "revoked", by))
                    .await?;
                return Ok(true);
            }
        }
        Err(ApiError::unavailable(
            "revoke: too many concurrent changes to the operator",
        ))
    }

    /// An operator lifecycle event, in the trail `operator:<sub>` (`airlock audit`).
    fn operator_audit(&self, sub: &str, decision: &str, by: &str) -> AuditRecord {
        let now = self.now();
        AuditRecord {
            audit_id: new_id("aud", now),
            at: now,
            event: "operator".into(),
            decision: decision.into(),
            reason_code: None,
            reason: None,
            action_type: None,
            plan_id: Some(operator_trail(sub)),
            action_id: None,
            idempotency_key: None,
            operator_id: sub.to_string(),
            service_principal: by.to_string(),
            payload_hash: None,
            risk_checks: Vec::new(),
            order_id: None,
            job_id: None,
            chat_session_id: None,
            tool_call_id: None,
            request_id: new_id("req", now),
            policy_version: None,
            approver: Some(by.to_string()),
            credential_id: None,
            user_verified: None,
            apigw_request_id: crate::telemetry::gateway_ids().0,
            lambda_request_id: crate::telemetry::gateway_ids().1,
        }
    }

    /// The operator an enrolment link is for, with its expiry, if the link is live: its
    /// document exists and the operator's record still names it as their open link.
    pub async fn enrolment(&self, secret: &str) -> Result<(String, Millis), ApiError> {
        let (op, _, link) = self.live_link(secret).await?;
        Ok((op.sub, link.expires_at))
    }

    async fn live_link(&self, secret: &str) -> Result<(OperatorDoc, u64, OpenLink), ApiError> {
        check_token("enrolment", secret)?;
        let id = hash_id(secret);
        let now = self.now();
        let Some(d) = self.docs.get_doc(DocKind::Enrolment, &id, now).await? else {
            return Err(enrolment_not_found());
        };
        let e: EnrolmentDoc = from_doc(&d)?;
        match self.operator(&e.sub).await? {
            Some((op, v)) => match op.open_link.clone() {
                Some(link) if link.id == id && link.expires_at > now => Ok((op, v, link)),
                _ => Err(enrolment_not_found()),
            },
            None => Err(enrolment_not_found()),
        }
    }

    /// Stores a ceremony's challenge under `id` (replacing an earlier one under the same
    /// id: one outstanding challenge per link, or per session, plan and decision).
    async fn put_challenge(&self, id: &str, c: &ChallengeDoc) -> Result<(), ApiError> {
        let now = self.now();
        for _ in 0..8 {
            let current = self
                .docs
                .get_doc(DocKind::Challenge, id, now)
                .await?
                .map(|d| d.version)
                .unwrap_or(0);
            let doc = Doc {
                body: to_value(c)?,
                version: current + 1,
                expires_at: Some(now + CHALLENGE_TTL_MS),
            };
            if self
                .docs
                .put_doc(DocKind::Challenge, id, &doc, current, now)
                .await?
            {
                return Ok(());
            }
        }
        Err(ApiError::unavailable(
            "too many concurrent passkey ceremonies; try again",
        ))
    }

    /// Takes a challenge (single use): absent, expired or already used is refused.
    async fn take_challenge(&self, id: &str) -> Result<ChallengeDoc, ApiError> {
        check_token("/challenge_id", id)?;
        match self
            .docs
            .take_doc(DocKind::Challenge, id, self.now())
            .await?
        {
            Some(d) => from_doc(&d),
            None => Err(passkey_invalid(
                "the challenge is unknown, expired or already used",
            )),
        }
    }

    /// Starts registering a passkey through an enrolment link.
    pub async fn start_registration(
        &self,
        secret: &str,
    ) -> Result<Ceremony<CreationChallengeResponse>, ApiError> {
        let (op, _, link) = self.live_link(secret).await?;
        let exclude = op
            .credentials
            .iter()
            .map(|c| c.cred_id().clone())
            .collect::<Vec<_>>();
        let (options, state) = self
            .rp()?
            .start_passkey_registration(op.user_id, &op.sub, &op.sub, Some(exclude))
            .map_err(|e| ApiError::internal(format!("start registration: {e}")))?;
        let challenge_id = derived_id("register", &[&link.id]);
        self.put_challenge(
            &challenge_id,
            &ChallengeDoc {
                sub: op.sub.clone(),
                purpose: Purpose::Register {
                    enrolment: link.id.clone(),
                },
                state: to_value(&state)?,
            },
        )
        .await?;
        Ok(Ceremony {
            challenge_id,
            options,
        })
    }

    /// Finishes a registration: the enrolment link is used up, the passkey joins the
    /// operator's, and the operator is signed in.
    pub async fn finish_registration(
        &self,
        secret: &str,
        challenge_id: &str,
        credential: serde_json::Value,
    ) -> Result<(String, NewSession), ApiError> {
        check_token("enrolment", secret)?;
        let link_id = hash_id(secret);
        let c = self.take_challenge(challenge_id).await?;
        if c.purpose
            != (Purpose::Register {
                enrolment: link_id.clone(),
            })
        {
            return Err(passkey_invalid(
                "the challenge was issued for something else",
            ));
        }
        let credential: RegisterPublicKeyCredential = serde_json::from_value(credential)
            .map_err(|e| ApiError::invalid("/credential", e.to_string()))?;
        let state: PasskeyRegistration = serde_json::from_value(c.state)
            .map_err(|e| ApiError::internal(format!("registration state: {e}")))?;
        let passkey = self
            .rp()?
            .finish_passkey_registration(&credential, &state)
            .map_err(passkey_invalid)?;
        // A credential belongs to one operator only.
        let now = self.now();
        for d in self.docs.list_docs(DocKind::Operator, now).await? {
            let other: OperatorDoc = from_doc(&d)?;
            if other
                .credentials
                .iter()
                .any(|k| k.cred_id() == passkey.cred_id())
            {
                return Err(passkey_invalid("this passkey is registered already"));
            }
        }
        for _ in 0..8 {
            let (mut op, version) = self
                .operator(&c.sub)
                .await?
                .ok_or_else(enrolment_not_found)?;
            // The link must still be the operator's open one: a revocation or a newer link
            // since the ceremony started closed it. Closing it in the same conditional
            // write makes it single-use: of two racing registrations, one wins.
            match &op.open_link {
                Some(l) if l.id == link_id && l.expires_at > self.now() => {}
                _ => return Err(enrolment_not_found()),
            }
            op.open_link = None;
            op.credentials.push(passkey.clone());
            op.updated_at = self.now();
            if self.save_operator(&op, version).await? {
                self.docs
                    .take_doc(DocKind::Enrolment, &link_id, now)
                    .await?;
                let mut audit = self.operator_audit(&op.sub, "passkey_registered", &op.sub);
                audit.credential_id = Some(
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .encode::<&[u8]>(passkey.cred_id().as_ref()),
                );
                audit.user_verified = Some(true);
                self.audit.append(&audit).await?;
                let session = self.open_session(&op).await?;
                tracing::info!(operator = %op.sub, "passkey enrolled");
                return Ok((op.sub, session));
            }
        }
        Err(ApiError::unavailable(
            "enrolment: too many concurrent changes to the operator",
        ))
    }

    // ---- Sign-in ------------------------------------------------------------------------

    /// Starts a passkey sign-in for an operator id. Every id gets the same answer: an
    /// enrolled operator's credential ids, or believable decoys for an id that has no
    /// passkey; and nothing is stored (the ceremony travels sealed in `challenge_id`).
    pub async fn start_sign_in(
        &self,
        sub: &str,
    ) -> Result<Ceremony<RequestChallengeResponse>, ApiError> {
        check_sub(sub)
            .map_err(|_| ApiError::invalid("/operator_id", "must be your operator id"))?;
        let rp = self.rp()?;
        let options = match self.active_operator(sub).await? {
            Some(op) => {
                rp.start_passkey_authentication(&op.credentials)
                    .map_err(|e| ApiError::internal(format!("start authentication: {e}")))?
                    .0
            }
            None => self.decoy_options(sub)?,
        };
        let ticket = SignInTicket {
            s: sub.to_string(),
            c: B64.encode(&options.public_key.challenge),
            e: self.now() + CHALLENGE_TTL_MS,
        };
        Ok(Ceremony {
            challenge_id: self.tickets.encode(SIGN_IN_SCOPE, &ticket),
            options,
        })
    }

    async fn active_operator(&self, sub: &str) -> Result<Option<OperatorDoc>, ApiError> {
        Ok(self
            .operator(sub)
            .await?
            .map(|(op, _)| op)
            .filter(|op| op.revoked_at.is_none() && !op.credentials.is_empty()))
    }

    /// What a sign-in for an operator id without a passkey answers: the options an
    /// enrolled operator gets, with decoy credential ids.
    fn decoy_options(&self, sub: &str) -> Result<RequestChallengeResponse, ApiError> {
        use rand::RngCore;
        let mut challenge = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut challenge);
        let allow: Vec<serde_json::Value> = self
            .decoys
            .for_sub(sub)
            .iter()
            .map(|id| serde_json::json!({"type": "public-key", "id": B64.encode(id)}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "publicKey": {
                "challenge": B64.encode(challenge),
                "timeout": webauthn_rs::DEFAULT_AUTHENTICATOR_TIMEOUT.as_millis() as u64,
                "rpId": self.rp_id()?,
                "allowCredentials": allow,
                "userVerification": "required",
            }
        }))
        .map_err(|e| ApiError::internal(format!("sign-in options: {e}")))
    }

    async fn start_assertion(
        &self,
        id: &str,
        op: &OperatorDoc,
        purpose: Purpose,
    ) -> Result<Ceremony<RequestChallengeResponse>, ApiError> {
        let (options, state) = self
            .rp()?
            .start_passkey_authentication(&op.credentials)
            .map_err(|e| ApiError::internal(format!("start authentication: {e}")))?;
        self.put_challenge(
            id,
            &ChallengeDoc {
                sub: op.sub.clone(),
                purpose,
                state: to_value(&state)?,
            },
        )
        .await?;
        Ok(Ceremony {
            challenge_id: id.to_string(),
            options,
        })
    }

    /// Verifies an assertion against a taken challenge and the operator's passkeys, and
    /// keeps the passkey's counter. Returns the operator, the credential id and the UV flag.
    async fn finish_assertion(
        &self,
        c: &ChallengeDoc,
        credential: serde_json::Value,
    ) -> Result<(OperatorDoc, String, bool), ApiError> {
        let credential: PublicKeyCredential = serde_json::from_value(credential)
            .map_err(|e| ApiError::invalid("/credential", e.to_string()))?;
        let state: PasskeyAuthentication = serde_json::from_value(c.state.clone())
            .map_err(|e| ApiError::internal(format!("authentication state: {e}")))?;
        let result = self
            .rp()?
            .finish_passkey_authentication(&credential, &state)
            .map_err(passkey_invalid)?;
        if !result.user_verified() {
            return Err(passkey_invalid("the authenticator did not verify the user"));
        }
        let cred_id = B64.encode::<&[u8]>(result.cred_id().as_ref());
        for _ in 0..8 {
            let (mut op, version) = match self.operator(&c.sub).await? {
                Some((op, v)) if op.revoked_at.is_none() => (op, v),
                _ => return Err(passkey_invalid("this passkey is not registered to you")),
            };
            let mut found = false;
            let mut changed = false;
            for k in op.credentials.iter_mut() {
                if let Some(updated) = k.update_credential(&result) {
                    found = true;
                    changed |= updated;
                }
            }
            if !found {
                return Err(passkey_invalid("this passkey is not registered to you"));
            }
            if !changed || self.save_operator(&op, version).await? {
                return Ok((op, cred_id, true));
            }
        }
        Err(ApiError::unavailable(
            "sign-in: too many concurrent changes to the operator",
        ))
    }

    /// Finishes a sign-in: a new session. The ticket is single-use: its use is recorded
    /// only once a passkey of the operator has signed it (so storage grows with sign-ins,
    /// never with strangers' requests).
    pub async fn finish_sign_in(
        &self,
        challenge_id: &str,
        credential: serde_json::Value,
    ) -> Result<(String, NewSession), ApiError> {
        let unknown = || passkey_invalid("the sign-in is unknown or expired; start again");
        let t: SignInTicket = self
            .tickets
            .decode(SIGN_IN_SCOPE, challenge_id)
            .map_err(|_| unknown())?;
        let now = self.now();
        if now >= t.e {
            return Err(unknown());
        }
        let Some(op) = self.active_operator(&t.s).await? else {
            return Err(passkey_invalid("this passkey is not registered to you"));
        };
        // The authentication state for the operator's passkeys now, holding the ticket's
        // challenge (the state is not kept between the two requests).
        let (_, state) = self
            .rp()?
            .start_passkey_authentication(&op.credentials)
            .map_err(|e| ApiError::internal(format!("start authentication: {e}")))?;
        let mut state = to_value(&state)?;
        match state.pointer_mut("/ast/challenge") {
            Some(c) => *c = serde_json::Value::String(t.c.clone()),
            None => {
                return Err(ApiError::internal(
                    "authentication state without a challenge",
                ))
            }
        }
        let c = ChallengeDoc {
            sub: t.s.clone(),
            purpose: Purpose::SignIn,
            state,
        };
        let (op, _, _) = self.finish_assertion(&c, credential).await?;
        let used = Doc {
            body: serde_json::json!({ "sub": op.sub, "used": "sign_in" }),
            version: 1,
            expires_at: Some(t.e),
        };
        if !self
            .docs
            .put_doc(
                DocKind::Challenge,
                &derived_id("signed-in", &[&t.c]),
                &used,
                0,
                now,
            )
            .await?
        {
            return Err(passkey_invalid(
                "this sign-in was used already; start again",
            ));
        }
        let session = self.open_session(&op).await?;
        Ok((op.sub, session))
    }

    async fn open_session(&self, op: &OperatorDoc) -> Result<NewSession, ApiError> {
        let secret = random_secret();
        let now = self.now();
        let doc = Doc {
            body: to_value(&SessionDoc {
                sub: op.sub.clone(),
                csrf: random_secret(),
                created_at: now,
                epoch: op.session_epoch,
            })?,
            version: 1,
            expires_at: Some(now + self.session_ttl_s as i64 * 1000),
        };
        self.docs
            .put_doc(DocKind::Session, &hash_id(&secret), &doc, 0, now)
            .await?;
        Ok(NewSession {
            secret,
            max_age_s: self.session_ttl_s,
        })
    }

    /// The signed-in operator of a session cookie's secret, if the session is live, the
    /// operator not revoked, and no revocation happened since the session opened.
    pub async fn session(&self, secret: &str) -> Result<Option<SignedIn>, ApiError> {
        if check_token("session", secret).is_err() {
            return Ok(None);
        }
        let id = hash_id(secret);
        let now = self.now();
        let Some(d) = self.docs.get_doc(DocKind::Session, &id, now).await? else {
            return Ok(None);
        };
        let s: SessionDoc = from_doc(&d)?;
        match self.operator(&s.sub).await? {
            Some((op, _)) if op.revoked_at.is_none() && op.session_epoch == s.epoch => {
                Ok(Some(SignedIn {
                    operator: op,
                    session_id: id,
                    csrf: s.csrf,
                    expires_at: d.expires_at.unwrap_or_default(),
                }))
            }
            _ => Ok(None),
        }
    }

    /// Ends a session.
    pub async fn sign_out(&self, who: &SignedIn) -> Result<(), ApiError> {
        self.docs
            .take_doc(DocKind::Session, &who.session_id, self.now())
            .await?;
        Ok(())
    }

    // ---- Plans --------------------------------------------------------------------------

    /// Plans waiting for this operator, newest first, `limit` a page after `before`: their
    /// own, and, for approvers, the four-eyes plans of their desks. Two indexed queries,
    /// so what others have pending never pushes a plan of theirs off the list.
    pub async fn pending(
        &self,
        who: &SignedIn,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> Result<PendingPage, ApiError> {
        let now = self.now();
        let op = &who.operator;
        let limit = limit.max(1);
        let want = limit + 1;
        let mut plans = self
            .plans
            .list_awaiting_by_requester(&op.sub, now, before, want)
            .await?;
        if op.can(&self.roles, Permission::Approve) {
            let scope = op.desk_scope(&self.roles);
            plans.extend(
                self.plans
                    .list_awaiting_four_eyes(&scope, now, before, want)
                    .await?,
            );
        }
        // The indexes can lag on DynamoDB: every plan is checked again.
        let scope = op.desk_scope(&self.roles);
        plans.retain(|p| {
            p.awaits_approval(now)
                && scope.allows(&p.desk)
                && p.confirmation == crate::core::policy::ConfirmationMode::Operator
                && (p.requested_by == op.sub || p.four_eyes)
        });
        plans.sort_by(|a, b| (b.expires_at, &b.plan_id).cmp(&(a.expires_at, &a.plan_id)));
        plans.dedup_by(|a, b| a.plan_id == b.plan_id);
        let next = (plans.len() > limit as usize).then(|| {
            let last = &plans[limit as usize - 1];
            (last.expires_at, last.plan_id.clone())
        });
        plans.truncate(limit as usize);
        Ok(PendingPage { plans, next })
    }

    /// A plan as this operator may see it (404 for another desk's or a missing plan).
    pub async fn plan_page(&self, who: &SignedIn, plan_id: &str) -> Result<PlanPage, ApiError> {
        let plan = self.visible_plan(who, plan_id).await?;
        Ok(PlanPage {
            approve: self.may(who, &plan, ApprovalDecision::Approved),
            decline: self.may(who, &plan, ApprovalDecision::Declined),
            plan,
        })
    }

    async fn visible_plan(&self, who: &SignedIn, plan_id: &str) -> Result<PlanRecord, ApiError> {
        match self.plans.get_plan(plan_id).await? {
            Some(p)
                if who.operator.desk_scope(&self.roles).allows(&p.desk)
                    && p.confirmation == crate::core::policy::ConfirmationMode::Operator =>
            {
                Ok(p)
            }
            _ => Err(super::not_found(Code::PlanNotFound, "plan", plan_id)),
        }
    }

    /// Whether this operator may take this decision on this plan now, and why not.
    fn may(&self, who: &SignedIn, plan: &PlanRecord, d: ApprovalDecision) -> Result<(), String> {
        let now = self.now();
        let op = &who.operator;
        if let Some(a) = &plan.approval {
            return Err(format!(
                "{} already {} this plan at {}.",
                a.approver,
                a.decision.as_str(),
                human_time(a.at)
            ));
        }
        if !plan.executable {
            return Err("This plan failed its risk checks; there is nothing to approve.".into());
        }
        if plan.status != crate::core::records::PlanStatus::Planned {
            return Err("This plan is no longer waiting for a decision.".into());
        }
        if now >= plan.expires_at {
            return Err(format!(
                "This plan expired at {}; ask the agent for a new plan.",
                human_time(plan.expires_at)
            ));
        }
        let own = plan.requested_by == op.sub;
        // The requester may always withdraw their own plan.
        if d == ApprovalDecision::Declined && own {
            return Ok(());
        }
        if plan.four_eyes {
            // Maker and checker: the requester's own approval and another approver's, each
            // a passkey assertion of its own, in either order.
            if d == ApprovalDecision::Approved && plan.approved_by(&op.sub) {
                return Err(format!(
                    "You approved this plan already; it waits for {}.",
                    still_needed(plan)
                ));
            }
            if own {
                if !op.can(&self.roles, Permission::Execute) {
                    return Err(format!(
                        "{} has no role that may execute trades, so cannot approve one.",
                        op.sub
                    ));
                }
                return Ok(());
            }
            if !op.can(&self.roles, Permission::Approve) {
                return Err(format!(
                    "Approving four-eyes orders needs the approve permission on desk {}, which {} does not have.",
                    plan.desk, op.sub
                ));
            }
            if d == ApprovalDecision::Approved {
                if let Some(a) = plan
                    .approvals
                    .iter()
                    .find(|a| a.approver != plan.requested_by)
                {
                    return Err(format!(
                        "{} approved this plan as the second person already; it waits for {}.",
                        a.approver,
                        still_needed(plan)
                    ));
                }
            }
            return Ok(());
        }
        if !own {
            return Err(format!(
                "Only {}, who asked for this plan, approves it.",
                plan.requested_by
            ));
        }
        if !op.can(&self.roles, Permission::Execute) {
            return Err(format!(
                "{} has no role that may execute trades, so cannot approve one.",
                op.sub
            ));
        }
        Ok(())
    }

    /// Starts an approval or a decline: a passkey ceremony bound to the plan, its payload
    /// hash, the decision and this session.
    pub async fn start_decision(
        &self,
        who: &SignedIn,
        plan_id: &str,
        d: ApprovalDecision,
        request_id: &str,
    ) -> Result<Ceremony<RequestChallengeResponse>, ApiError> {
        let plan = self.visible_plan(who, plan_id).await?;
        if let Err(why) = self.may(who, &plan, d) {
            return Err(self.refuse(who, &plan, None, why, request_id).await);
        }
        let id = derived_id("decide", &[&who.session_id, &plan.plan_id, d.as_str()]);
        self.start_assertion(
            &id,
            &who.operator,
            Purpose::Decide {
                plan_id: plan.plan_id.clone(),
                payload_hash: plan.payload_hash.clone(),
                decision: d,
                session: who.session_id.clone(),
            },
        )
        .await
    }

    /// Finishes an approval or a decline with the operator's assertion, and records it on
    /// the plan (with its audit record) if the plan still waits for it.
    pub async fn finish_decision(
        &self,
        who: &SignedIn,
        plan_id: &str,
        challenge_id: &str,
        credential: serde_json::Value,
        request_id: &str,
    ) -> Result<Approval, ApiError> {
        let plan = self.visible_plan(who, plan_id).await?;
        let c = self.take_challenge(challenge_id).await?;
        let (payload_hash, decision) = match &c.purpose {
            Purpose::Decide {
                plan_id: p,
                payload_hash,
                decision,
                session,
            } if p == &plan.plan_id && c.sub == who.operator.sub && session == &who.session_id => {
                (payload_hash.clone(), *decision)
            }
            _ => {
                let why = "the passkey challenge was issued for another plan, operator or sign-in";
                return Err(self
                    .refuse(who, &plan, None, why.to_string(), request_id)
                    .await
                    .with_code(Code::PasskeyInvalid));
            }
        };
        if payload_hash != plan.payload_hash {
            let why = "the plan's payload is not the one you were shown";
            return Err(self
                .refuse(who, &plan, None, why.to_string(), request_id)
                .await
                .with_code(Code::PasskeyInvalid));
        }
        let (op, cred_id, uv) = match self.finish_assertion(&c, credential).await {
            Ok(x) => x,
            Err(e) => {
                let _ = self
                    .refuse(who, &plan, None, e.message.clone(), request_id)
                    .await;
                return Err(e);
            }
        };
        if let Err(why) = self.may(who, &plan, decision) {
            return Err(self
                .refuse(who, &plan, Some(&cred_id), why, request_id)
                .await);
        }
        let now = self.now();
        let approval = Approval {
            decision,
            approver: op.sub.clone(),
            credential_id: cred_id.clone(),
            user_verified: uv,
            payload_hash: plan.payload_hash.clone(),
            at: now,
        };
        let mut audit = self.audit_record(&op.sub, &plan, decision.as_str(), request_id);
        audit.credential_id = Some(cred_id.clone());
        audit.user_verified = Some(uv);
        if decision == ApprovalDecision::Declined {
            audit.reason_code = Some(Code::PlanDeclined.as_str().into());
            audit.reason = Some(format!("declined by {}", op.sub));
        }
        let mut approvals = plan.approvals.clone();
        let decides = match decision {
            // A decline closes the plan: execute answers `plan_declined` for good.
            ApprovalDecision::Declined => true,
            ApprovalDecision::Approved => {
                approvals.push(approval.clone());
                let maker = approvals.iter().any(|a| a.approver == plan.requested_by);
                let checker = approvals.iter().any(|a| a.approver != plan.requested_by);
                !plan.four_eyes || (maker && checker)
            }
        };
        if plan.four_eyes && decision == ApprovalDecision::Approved && !decides {
            audit.decision = "approved_partly".into();
        }
        let change = ApprovalChange {
            seen: plan.approvals.len(),
            approvals,
            decision: decides.then(|| approval.clone()),
            close: (decision == ApprovalDecision::Declined)
                .then(|| Code::PlanDeclined.as_str().to_string()),
        };
        if self
            .plans
            .record_approval(&plan.plan_id, &change, &audit, now)
            .await?
        {
            return Ok(approval);
        }
        // It changed meanwhile: say what it is now.
        let now_plan = self.visible_plan(who, plan_id).await?;
        let why = self
            .may(who, &now_plan, decision)
            .err()
            .unwrap_or_else(|| "the plan changed; reload the page".into());
        Err(self
            .refuse(who, &now_plan, Some(&cred_id), why, request_id)
            .await)
    }

    fn audit_record(
        &self,
        approver: &str,
        plan: &PlanRecord,
        decision: &str,
        request_id: &str,
    ) -> AuditRecord {
        let now = self.now();
        let chat = |k: &str| {
            plan.chat_context
                .get(k)
                .and_then(|v| v.as_str())
                .map(String::from)
        };
        AuditRecord {
            audit_id: new_id("aud", now),
            at: now,
            event: "approval".into(),
            decision: decision.into(),
            reason_code: None,
            reason: None,
            action_type: Some(plan.action_type),
            plan_id: Some(plan.plan_id.clone()),
            action_id: None,
            idempotency_key: None,
            operator_id: plan.requested_by.clone(),
            service_principal: plan.service_principal.clone(),
            payload_hash: Some(plan.payload_hash.clone()),
            risk_checks: Vec::new(),
            order_id: None,
            job_id: None,
            chat_session_id: chat("chat_session_id"),
            tool_call_id: chat("tool_call_id"),
            request_id: request_id.to_string(),
            policy_version: Some(plan.policy_version.clone()),
            approver: Some(approver.to_string()),
            credential_id: None,
            user_verified: None,
            apigw_request_id: crate::telemetry::gateway_ids().0,
            lambda_request_id: crate::telemetry::gateway_ids().1,
        }
    }

    /// Audits a refused approval and returns the error to answer with.
    async fn refuse(
        &self,
        who: &SignedIn,
        plan: &PlanRecord,
        cred_id: Option<&str>,
        why: String,
        request_id: &str,
    ) -> ApiError {
        let now = self.now();
        let code = if plan.status == crate::core::records::PlanStatus::Planned
            && plan.approval.is_none()
            && now >= plan.expires_at
        {
            Code::PlanExpired
        } else if plan.approval.is_some() || plan.status != crate::core::records::PlanStatus::Planned {
            Code::PlanNotPending
        } else {
            Code::ApprovalRefused
        };
        let mut audit = self.audit_record(&who.operator.sub, plan, "refused", request_id);
        audit.reason_code = Some(code.as_str().into());
        audit.reason = Some(why.clone());
        audit.credential_id = cred_id.map(String::from);
        if let Err(e) = self.audit.append(&audit).await {
            return e.into();
        }
        ApiError::new(code, why)
    }
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
