//! Operators: enrolment links, the operator records and their lifecycle (created, link issued,
//! re-enrolled, revoked), each step audited in the operator's trail.

use super::*;

impl Approvals {
    pub(super) async fn operator(&self, sub: &str) -> Result<Option<(OperatorDoc, u64)>, ApiError> {
        let now = self.now();
        match self.docs.get_doc(DocKind::Operator, sub, now).await? {
            Some(d) => Ok(Some((from_doc(&d)?, d.version))),
            None => Ok(None),
        }
    }

    /// Writes an operator at the version read; `false` when another write came first.
    pub(super) async fn save_operator(
        &self,
        op: &OperatorDoc,
        version: u64,
    ) -> Result<bool, ApiError> {
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
    pub(super) fn operator_audit(&self, sub: &str, decision: &str, by: &str) -> AuditRecord {
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

    pub(super) async fn live_link(
        &self,
        secret: &str,
    ) -> Result<(OperatorDoc, u64, OpenLink), ApiError> {
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
}
