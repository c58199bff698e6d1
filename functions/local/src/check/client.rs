//! The requests of a run: its stage, headers, tokens, timeout and budget, and the
//! answers as [`Answer`]s.

use std::time::{Duration, Instant};

use airlock::adapters::http_client::{HttpClient, HttpRequest};
use serde_json::{json, Value};

use super::contract::{array, fields, listing};

/// How long an accepted action may take to reach `succeeded` or `failed`.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);
/// The largest answer read (a page of 200 orders is far below).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// An answer: status, JSON body (`Null` when not JSON), its request id, and its text.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Value,
    pub(super) request_id: Option<String>,
    pub(super) text: String,
}

impl Answer {
    pub(super) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    /// `422 token_invalid: <message>` or `200 <the start of the body>`, for details.
    pub(super) fn brief(&self) -> String {
        if let Some(code) = self.body["error"]["code"].as_str() {
            let msg = self.body["error"]["message"].as_str().unwrap_or("");
            return format!("{} {code}: {msg}", self.status);
        }
        let text: String = self.text.chars().take(160).collect();
        format!("{} {}", self.status, text.trim())
    }

    pub(super) fn expect(&self, status: u16) -> Result<(), String> {
        if self.status == status {
            Ok(())
        } else {
            Err(format!("expected {status}, got {}", self.brief()))
        }
    }
}

/// Where to send requests, with what, and the run's shared findings.
pub(super) struct Ctx {
    pub(super) client: HttpClient,
    /// The API base (ends with the base path).
    pub(super) base: String,
    /// The stage root, where `/health` is.
    pub(super) root: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) auth: Vec<(String, String)>,
    pub(super) timeout: Duration,
    pub(super) deadline: Instant,
    pub(super) operator: String,
    pub(super) run_id: String,
}

impl Ctx {
    pub(super) async fn send(&self, req: HttpRequest, authed: bool) -> Result<Answer, String> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("not sent: the run's 55 s budget is spent".into());
        }
        let mut req = req.timeout(self.timeout.min(left)).max_body(MAX_ANSWER);
        for (k, v) in self
            .headers
            .iter()
            .chain(if authed { &self.auth[..] } else { &[] })
        {
            req = req.header(k.clone(), v.clone());
        }
        let url = req.url.clone();
        let r = self
            .client
            .send(req)
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let text = String::from_utf8_lossy(&r.body).into_owned();
        Ok(Answer {
            status: r.status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            request_id: r.header("x-request-id").map(String::from),
            text,
        })
    }

    pub(super) async fn get(&self, path: &str) -> Result<Answer, String> {
        self.send(HttpRequest::get(format!("{}{path}", self.base)), true)
            .await
    }

    pub(super) async fn post(
        &self,
        path: &str,
        body: impl Into<Vec<u8>>,
    ) -> Result<Answer, String> {
        self.send(
            HttpRequest::post_json(format!("{}{path}", self.base), body),
            true,
        )
        .await
    }

    /// A listing page read at `path` (see [`listing`]): its rows.
    pub(super) async fn list(
        &self,
        path: &str,
        list: &str,
        keys: &[&str],
    ) -> Result<Vec<Value>, String> {
        let a = self.get(path).await?;
        listing(&a, list, keys).cloned()
    }

    /// A plan request body for this run's operator, traced to the run's chat session.
    pub(super) fn plan_body(&self, action_type: &str, payload: Value, tool: &str) -> Value {
        json!({
            "action_type": action_type,
            "payload": payload,
            "requested_by": self.operator,
            "chat_context": {"chat_session_id": self.run_id, "tool_call_id": tool},
        })
    }

    /// Executes `plan` (its id and token) under the key `key` and expects `202 queued`.
    pub(super) async fn execute_accepted(
        &self,
        plan: &Value,
        key: &str,
        what: &str,
    ) -> Result<Accepted, String> {
        let token = plan["confirmation_token"]
            .as_str()
            .ok_or_else(|| format!("{what}: the plan has no confirmation token"))?;
        let plan_id = plan["plan_id"].as_str().unwrap_or_default();
        let body = self.execute_body(plan_id, Some(token), key).to_string();
        let a = self.post("/actions/execute", body.clone()).await?;
        accepted(&a, body, what)
    }

    pub(super) fn execute_body(&self, plan_id: &str, token: Option<&str>, key: &str) -> Value {
        let mut b = json!({
            "plan_id": plan_id,
            "idempotency_key": format!("{}:{key}", self.run_id),
            "requested_by": self.operator,
            "chat_context": {"chat_session_id": self.run_id, "tool_call_id": key},
        });
        if let Some(t) = token {
            b["confirmation_token"] = json!(t);
        }
        b
    }

    /// [`Ctx::plan`] of a positions sync of `account`.
    pub(super) async fn plan_sync(&self, account: &str, tool: &str) -> Result<Answer, String> {
        self.plan("positions.sync", json!({"account_id": account}), tool)
            .await
    }

    pub(super) async fn plan(
        &self,
        action_type: &str,
        payload: Value,
        tool: &str,
    ) -> Result<Answer, String> {
        let a = self
            .post(
                "/actions/plan",
                self.plan_body(action_type, payload, tool).to_string(),
            )
            .await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the plan",
            &[
                "plan_id",
                "action_type",
                "normalized_payload",
                "risk_checks",
                "preview",
                "executable",
                "requires_confirmation",
                "confirmation_token",
                "expires_at",
                "queue_target",
                "policy_version",
                "approval",
            ],
        )?;
        for c in array(&a.body, "risk_checks")? {
            fields(c, "a risk check", &["name", "status", "reason"])?;
        }
        Ok(a)
    }

    /// Follows an action until `succeeded` or `failed` (at most [`SETTLE_WITHIN`]).
    pub(super) async fn settle(&self, action_id: &str) -> Result<(Value, Duration), String> {
        let started = Instant::now();
        let wait = self.timeout.as_secs().saturating_sub(2).min(5);
        loop {
            let a = self
                .get(&format!("/actions/{action_id}?wait={wait}"))
                .await?;
            a.expect(200)?;
            let status = a.body["status"].as_str().unwrap_or("").to_string();
            if status == "succeeded" || status == "failed" {
                return Ok((a.body, started.elapsed()));
            }
            if started.elapsed() > SETTLE_WITHIN {
                return Err(format!(
                    "action {action_id} still {status} after {} s (are the workers running?)",
                    SETTLE_WITHIN.as_secs()
                ));
            }
            if wait == 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// An order of the account as `GET /orders` lists it (newest first, first 200).
    pub(super) async fn order(&self, account: &str, order_id: &str) -> Result<Value, String> {
        let a = self
            .get(&format!("/orders?account_id={account}&limit=200"))
            .await?;
        a.expect(200)?;
        array(&a.body, "orders")?
            .iter()
            .find(|o| o["order_id"] == order_id)
            .cloned()
            .ok_or_else(|| format!("order {order_id} is not among the account's newest 200"))
    }
}

/// An accepted execute: what to replay and follow.
pub(super) struct Accepted {
    pub(super) body: String,
    pub(super) action_id: String,
    pub(super) resource: Option<String>,
}

/// `202 queued` with an action id.
fn accepted(a: &Answer, body: String, what: &str) -> Result<Accepted, String> {
    a.expect(202)?;
    if a.body["status"] != "queued" {
        return Err(format!(
            "{what}: status {} instead of queued",
            a.body["status"]
        ));
    }
    let action_id = a.body["action_id"]
        .as_str()
        .ok_or_else(|| format!("{what}: no action_id"))?
        .to_string();
    let refs = &a.body["resource_refs"];
    Ok(Accepted {
        body,
        action_id,
        resource: refs["order_id"]
            .as_str()
            .or(refs["job_id"].as_str())
            .map(String::from),
    })
}
