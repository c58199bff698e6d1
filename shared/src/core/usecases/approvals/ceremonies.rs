//! Passkey ceremonies: registration at enrolment, sign-in with stateless tickets and decoy
//! credentials, the challenges kept for one use, and sessions.

use super::*;

impl Approvals {
    /// Stores a ceremony's challenge under `id` (replacing an earlier one under the same
    /// id: one outstanding challenge per link, or per session, plan and decision).
    pub(super) async fn put_challenge(&self, id: &str, c: &ChallengeDoc) -> Result<(), ApiError> {
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
    pub(super) async fn take_challenge(&self, id: &str) -> Result<ChallengeDoc, ApiError> {
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

    pub(super) async fn active_operator(&self, sub: &str) -> Result<Option<OperatorDoc>, ApiError> {
        Ok(self
            .operator(sub)
            .await?
            .map(|(op, _)| op)
            .filter(|op| op.revoked_at.is_none() && !op.credentials.is_empty()))
    }

    /// What a sign-in for an operator id without a passkey answers: the options an
    /// enrolled operator gets, with decoy credential ids.
    pub(super) fn decoy_options(&self, sub: &str) -> Result<RequestChallengeResponse, ApiError> {
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

    pub(super) async fn start_assertion(
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
    pub(super) async fn finish_assertion(
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

    pub(super) async fn open_session(&self, op: &OperatorDoc) -> Result<NewSession, ApiError> {
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
}
