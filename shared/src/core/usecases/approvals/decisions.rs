//! Decisions: the pending list, a plan's page, who may approve what (four eyes), and an
//! approval or a decline signed with the operator's passkey.

use super::*;

impl Approvals {
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

    pub(super) async fn visible_plan(
        &self,
        who: &SignedIn,
        plan_id: &str,
    ) -> Result<PlanRecord, ApiError> {
        match self.plans.get_plan(plan_id).await? {
            Some(p)
                if who.operator.desk_scope(&self.roles).allows(&p.desk)
                    && p.confirmation == crate::core::policy::ConfirmationMode::Operator =>
            {
                Ok(p)
            }
            _ => Err(crate::core::usecases::not_found(
                Code::PlanNotFound,
                "plan",
                plan_id,
            )),
        }
    }

    /// Whether this operator may take this decision on this plan now, and why not.
    pub(super) fn may(
        &self,
        who: &SignedIn,
        plan: &PlanRecord,
        d: ApprovalDecision,
    ) -> Result<(), String> {
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

    pub(super) fn audit_record(
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
    pub(super) async fn refuse(
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
        } else if plan.approval.is_some()
            || plan.status != crate::core::records::PlanStatus::Planned
        {
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
