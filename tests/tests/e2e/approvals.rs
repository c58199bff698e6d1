//! Operator approval over HTTP, on both backends: an `operator`-mode plan carries no token,
//! execute waits for the approval and decides nothing meanwhile, the approval page's
//! passkey ceremonies (a software authenticator, `airlock_tests::passkey`), four eyes,
//! declines, expiry, the audit trail, and the agent's attempts to walk around it: its
//! tokens, the URL alone, forged, replayed and crossed assertions, missing anti-forgery
//! tokens, the admin-only enrolment API. The page itself in a real browser is
//! `tests/browser_approvals.rs`.

use airlock_tests::passkey::{enroll, ApprovalClient, Passkey};
use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use serde_json::{json, Value};

fn start(b: Backend, policy: Option<&str>) -> Server {
    let stack = Stack::new(b).operator_mode();
    if let Some(p) = policy {
        std::fs::write(stack.state_dir.join("policy.json"), p).expect("policy.json");
    }
    stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)])
}

fn origin(s: &Server) -> String {
    airlock_tests::passkey::origin_of(s)
}

async fn plan(t: &Api, qty: u32) -> Resp {
    let p = t.plan_buy("CLF27", qty).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    p
}

fn audit(s: &Server, plan_id: &str) -> Vec<Value> {
    s.cli(&["audit", plan_id])
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit JSON"))
        .collect()
}

/// An enrolled, signed-in operator.
async fn signed_in(s: &Server, sub: &str, roles: &str, desks: &str) -> (ApprovalClient, Passkey) {
    let link = enroll(s, sub, roles, desks);
    let mut c = ApprovalClient::new(&s.base);
    let mut key = Passkey::new();
    let r = c.enroll(&link, &mut key).await;
    assert_eq!(r.status, 200, "enrol: {}", r.body);
    (c, key)
}

both!(an_operator_mode_plan_executes_only_after_the_passkey_approval);
async fn an_operator_mode_plan_executes_only_after_the_passkey_approval(b: Backend) {
    let s = start(b, None);
    let t = s.trader();
    let p = plan(&t, 1).await;
    assert_eq!(
        p["confirmation_token"],
        Value::Null,
        "no token in operator mode"
    );
    let pid = p.plan_id();
    assert_eq!(p["approval"]["required"], true);
    assert_eq!(p["approval"]["four_eyes"], false);
    assert_eq!(
        p["approval"]["url"],
        format!("{}/approvals/plans/{pid}", origin(&s))
    );
    assert_eq!(p["approval"]["expires_at"], p["expires_at"]);

    // Before the approval: 409, decides nothing, the same key works later.
    for _ in 0..2 {
        let e = t.execute_untokened(&pid, "chat-1:approve-me").await;
        assert_eq!(e.status, 409, "{:?}", e.body);
        assert_eq!(e.code(), "approval_required");
        assert_eq!(e["status"], "rejected");
        assert_eq!(e["approval"]["url"], p["approval"]["url"]);
    }
    assert_eq!(s.queued_messages(), 0);

    // Cancels and syncs stay on the token path by default (they reduce risk).
    let sync = t.plan_sync("ACC-1").await;
    assert!(sync["confirmation_token"].is_string(), "{:?}", sync.body);
    assert_eq!(sync["approval"], Value::Null);

    // A token for another plan does not stand in for the approval.
    let e = t
        .post(
            "/actions/execute",
            &json!({ "plan_id": pid, "confirmation_token": sync["confirmation_token"], "idempotency_key": "k-token", "requested_by": "op-energy-trader" }),
        )
        .await;
    assert_eq!(e.code(), "token_invalid", "{:?}", e.body);

    // The operator enrols a passkey through the admin's link, then approves.
    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let page = c.get(&format!("/approvals/plans/{pid}")).await;
    assert_eq!(page.status, 200);
    let html = page.body["text"].as_str().unwrap();
    assert!(
        html.contains(
            "Buy 1 CLF27 at market, protected: limit 68.90 (68.40 + 0.50) on ACC-1, day order."
        ),
        "{html}"
    );
    assert!(html.contains("data-state=\"pending\""));
    assert!(html.contains("chat-1"), "the chat that asked is shown");
    // A market order's value, at its protected limit (68.40 + 0.50), the most it can cost.
    assert!(
        html.contains("$68,900"),
        "a market order's notional: {html}"
    );
    let pending = c.get("/approvals").await.body["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(pending.contains(&pid), "{pending}");

    let a = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["approver"], "op-energy-trader");

    // A second approval of the same plan is refused: it is decided.
    let again = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(again.status, 409, "{}", again.body);
    assert_eq!(again.body["error"]["code"], "plan_not_pending");

    let e = t.execute_untokened(&pid, "chat-1:approve-me").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let replay = t.execute_untokened(&pid, "chat-1:approve-me").await;
    assert_eq!(replay.status, 200);
    assert_eq!(replay["status"], "duplicate");
    assert_eq!(replay["action_id"], e["action_id"]);
    assert_eq!(s.queued_messages(), 1);

    let trail = audit(&s, &pid);
    let approval = trail
        .iter()
        .find(|r| r["event"] == "approval" && r["decision"] == "approved")
        .expect("approval audited");
    assert_eq!(approval["approver"], "op-energy-trader");
    assert_eq!(approval["credential_id"], key.id());
    assert_eq!(approval["user_verified"], true);
    let refused: Vec<&Value> = trail
        .iter()
        .filter(|r| r["decision"] == "refused")
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the second approval is audited as refused"
    );
    assert!(trail
        .iter()
        .any(|r| r["event"] == "execute" && r["reason_code"] == "approval_required"));
}

both!(the_agent_cannot_approve);
async fn the_agent_cannot_approve(b: Backend) {
    let s = start(b, None);
    let t = s.trader();
    let (p1, p2) = (plan(&t, 1).await, plan(&t, 2).await);
    let (a, b2) = (p1.plan_id(), p2.plan_id());
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let o = origin(&s);

    // The URL alone, with the agent's tokens: a sign-in page, never the plan.
    let r = http
        .get(format!("{}/approvals/plans/{a}", s.base))
        .header("authorization", format!("Bearer {}", t.service))
        .header("x-operator-token", &t.operator)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(r.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with("/approvals/login"));
    // No route takes the agent's tokens: without a passkey session every decision is 401,
    // and without the page's origin 403.
    for (origin_header, want) in [(Some(o.as_str()), 401), (None, 403)] {
        for step in ["start", "finish"] {
            let mut rq = http
                .post(format!("{}/approvals/plans/{a}/{step}", s.base))
                .header("authorization", format!("Bearer {}", t.service))
                .header("x-operator-token", &t.operator)
                .header("x-csrf-token", "guess")
                .header("cookie", "airlock_approvals=forged-session-secret")
                .json(&match step {
                    "start" => json!({ "decision": "approved" }),
                    _ => json!({ "challenge_id": "forged", "credential": {} }),
                });
            if let Some(h) = origin_header {
                rq = rq.header("origin", h);
            }
            let r = rq.send().await.unwrap();
            assert_eq!(r.status().as_u16(), want, "{step}");
        }
    }
    // The REST API has no approval route at all.
    let r = t
        .post(
            &format!("/actions/{a}/approve"),
            &json!({ "decision": "approved" }),
        )
        .await;
    assert_eq!(r.status, 404);

    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;

    // A session without the page's anti-forgery token changes nothing.
    let token = c.csrf.take();
    let r = c
        .post(
            &format!("/approvals/plans/{a}/start"),
            json!({ "decision": "approved" }),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "csrf_rejected");
    c.csrf = token;

    // An assertion for another plan's challenge: refused, and that challenge is spent.
    let start_a = c.start(&a, "approved").await;
    assert_eq!(start_a.status, 200, "{}", start_a.body);
    let cred_a = key.assert(&start_a.body["options"], &c.origin);
    let crossed = c
        .finish(&b2, &start_a.body["challenge_id"], cred_a.clone())
        .await;
    assert_eq!(crossed.status, 422, "{}", crossed.body);
    assert_eq!(crossed.body["error"]["code"], "passkey_invalid");
    let replayed = c.finish(&a, &start_a.body["challenge_id"], cred_a).await;
    assert_eq!(replayed.body["error"]["code"], "passkey_invalid");

    // An assertion over the wrong challenge text (signed for another ceremony).
    let start_b = c.start(&b2, "approved").await;
    let old = start_a.body["options"]["publicKey"]["challenge"]
        .as_str()
        .unwrap();
    let rp = start_b.body["options"]["publicKey"]["rpId"]
        .as_str()
        .unwrap()
        .to_string();
    let wrong = key.assert_challenge(&rp, old, &c.origin);
    let r = c.finish(&b2, &start_b.body["challenge_id"], wrong).await;
    assert_eq!(r.body["error"]["code"], "passkey_invalid", "{}", r.body);

    // An assertion from another origin (a phishing page) is refused.
    let start_b = c.start(&b2, "approved").await;
    let phish = key.assert(&start_b.body["options"], "https://approvals.evil.example");
    let r = c.finish(&b2, &start_b.body["challenge_id"], phish).await;
    assert_eq!(r.body["error"]["code"], "passkey_invalid", "{}", r.body);

    // Without user verification: refused.
    key.user_verified = false;
    let r = c.decide(&b2, "approved", &mut key).await;
    assert_eq!(r.body["error"]["code"], "passkey_invalid", "{}", r.body);
    key.user_verified = true;

    // Another passkey (the agent's own authenticator) is not this operator's.
    let mut stranger = Passkey::new();
    let r = c.decide(&b2, "approved", &mut stranger).await;
    assert_eq!(r.body["error"]["code"], "passkey_invalid", "{}", r.body);

    // Neither plan was approved by any of that; a real approval of one still works once.
    for pid in [&a, &b2] {
        let e = t.execute_untokened(pid, &format!("k-{pid}")).await;
        assert_eq!(e.code(), "approval_required", "{:?}", e.body);
    }
    let ok = c.decide(&a, "approved", &mut key).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let refused = audit(&s, &b2)
        .into_iter()
        .filter(|r| r["decision"] == "refused")
        .count();
    assert!(refused >= 4, "refused approvals are audited ({refused})");

    // An enrolment link works once; an operator token alone cannot enrol.
    let link = enroll(&s, "op-viewer", "viewer", "energy");
    let mut v = ApprovalClient::new(&s.base);
    assert_eq!(v.enroll(&link, &mut Passkey::new()).await.status, 200);
    let w = ApprovalClient::new(&s.base);
    let path = link.split_once("/approvals/").unwrap().1;
    let again = w.post(&format!("/approvals/{path}/start"), json!({})).await;
    assert_eq!(again.status, 404);
    assert_eq!(again.body["error"]["code"], "enrolment_not_found");

    // The admin API: a trader, or an admin through Mastra's scopes, is refused.
    let body = json!({ "sub": "op-new", "roles": ["trader"], "desks": ["energy"] });
    let r = t.post("/operators/enrolments", &body).await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    let admin_op = s.operator_token("op-admin", "admin", None);
    let r = t
        .with_tokens(&t.service, &admin_op)
        .post("/operators/enrolments", &body)
        .await;
    assert_eq!(r.code(), "insufficient_scope", "{:?}", r.body);
    let admin_svc = s.cli(&[
        "token",
        "service",
        "--sub",
        "airlock-admin",
        "--scopes",
        "trade.read trade.admin",
    ]);
    let r = t
        .with_tokens(&admin_svc, &admin_op)
        .post("/operators/enrolments", &body)
        .await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    assert!(r["url"]
        .as_str()
        .unwrap()
        .starts_with(&format!("{o}/approvals/enroll/")));

    // Revoking ends the operator's session and passkeys.
    s.cli(&["operators", "revoke", "--sub", "op-energy-trader"]);
    let r = c.start(&b2, "approved").await;
    assert_eq!(r.status, 401, "{}", r.body);
    // Its passkey no longer signs in (answered as for a stranger).
    let r = c.sign_in("op-energy-trader", &mut key).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "passkey_invalid");
}

both!(a_declined_plan_never_executes_and_an_expired_one_cannot_be_approved);
async fn a_declined_plan_never_executes_and_an_expired_one_cannot_be_approved(b: Backend) {
    let s = start(b, None);
    let t = s.trader();
    let p = plan(&t, 1).await;
    let pid = p.plan_id();
    let late = plan(&t, 1).await;
    let late_id = late.plan_id();
    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let d = c.decide(&pid, "declined", &mut key).await;
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.body["decision"], "declined");
    for _ in 0..2 {
        let e = t.execute_untokened(&pid, "k-declined").await;
        assert_eq!(e.status, 422, "{:?}", e.body);
        assert_eq!(e.code(), "plan_declined");
    }
    let trail = audit(&s, &pid);
    assert!(trail.iter().any(|r| r["event"] == "approval"
        && r["decision"] == "declined"
        && r["credential_id"] == key.id()));

    // Ten minutes later (the plan lived five): the page refuses, and so does execute.
    let env = vec![("AIRLOCK_NOW", "2026-11-23T15:10:00Z")];
    let stack = s.crash();
    let s = stack.start(&env);
    let t = s.trader();
    let mut c2 = ApprovalClient::new(&s.base);
    let r = c2.sign_in("op-energy-trader", &mut key).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = c2.start(&late_id, "approved").await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "plan_expired");
    let e = t.execute_untokened(&late_id, "k-late").await;
    assert_eq!(e.code(), "plan_expired", "{:?}", e.body);
    assert!(audit(&s, &late_id)
        .iter()
        .any(|r| r["decision"] == "refused" && r["reason_code"] == "plan_expired"));
    drop(c);
}

both!(four_eyes_needs_the_requester_and_another_approver);
async fn four_eyes_needs_the_requester_and_another_approver(b: Backend) {
    // 2 CLF27 at the paper broker's reference is well above 100,000 USD; 1 contract of
    // a 1,000,000 limit is not.
    let s = start(b, Some(r#"{"four_eyes_above_notional": "100000"}"#));
    let t = s.trader();
    let p = plan(&t, 2).await;
    let pid = p.plan_id();
    assert_eq!(p["approval"]["four_eyes"], true, "{:?}", p.body);
    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    // A viewer of the desk may not approve.
    let (mut v, mut vkey) = signed_in(&s, "op-viewer", "viewer", "energy").await;
    assert_eq!(v.decide(&pid, "approved", &mut vkey).await.status, 403);

    // The checker first: not enough alone.
    let (mut h, mut hkey) = signed_in(&s, "op-head-trader", "head_trader", "").await;
    let list = h.get("/approvals").await.body["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(list.contains(&pid), "{list}");
    let a = h.decide(&pid, "approved", &mut hkey).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["approver"], "op-head-trader");
    let e = t.execute_untokened(&pid, "k-4e").await;
    assert_eq!(e.code(), "approval_required", "{:?}", e.body);
    assert_eq!(e["approval"]["approved_by"], json!(["op-head-trader"]));
    // Nobody approves twice, and a second checker does not replace the requester.
    let again = h.start(&pid, "approved").await;
    assert_eq!(again.status, 403, "{}", again.body);
    assert!(again.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("approved this plan already"));
    let (mut h2, mut h2key) = signed_in(&s, "op-head-2", "head_trader", "").await;
    let other = h2.decide(&pid, "approved", &mut h2key).await;
    assert_eq!(other.status, 403, "{}", other.body);
    // The page says who approved and who is still needed.
    let page = c.get(&format!("/approvals/plans/{pid}")).await.body["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(page.contains("id=\"approved-by\">op-head-trader"), "{page}");
    assert!(
        page.contains("op-energy-trader, who asked for it"),
        "{page}"
    );

    // The requester's own passkey completes it.
    let a = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let e = t.execute_untokened(&pid, "k-4e").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    let trail = audit(&s, &pid);
    assert!(trail
        .iter()
        .any(|r| r["decision"] == "approved_partly" && r["approver"] == "op-head-trader"));
    assert!(trail
        .iter()
        .any(|r| r["decision"] == "approved" && r["approver"] == "op-energy-trader"));

    // The other order: the requester first, then the checker.
    let p = plan(&t, 2).await;
    let pid = p.plan_id();
    assert_eq!(c.decide(&pid, "approved", &mut key).await.status, 200);
    assert_eq!(
        t.execute_untokened(&pid, "k-4e-2").await.code(),
        "approval_required"
    );
    let mine = c.start(&pid, "approved").await;
    assert_eq!(mine.status, 403, "{}", mine.body);
    let a = h2.decide(&pid, "approved", &mut h2key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(t.execute_untokened(&pid, "k-4e-2").await.status, 202);
}

both!(the_pending_list_shows_own_and_four_eyes_plans_newest_first);
/// The pending list: the operator's own plans and the four-eyes plans of their desks,
/// newest first; a colleague's own plans are not theirs to see.
async fn the_pending_list_shows_own_and_four_eyes_plans_newest_first(b: Backend) {
    let s = start(b, Some(r#"{"four_eyes_above_notional": "100000"}"#));
    let t = s.trader();
    let head = airlock_tests::Api::new(
        &s,
        s.service_token(),
        s.operator_token("op-head-trader", "head_trader", None),
    );
    let own_small = plan(&t, 1).await.plan_id();
    let own_large = plan(&t, 2).await.plan_id();
    let heads_small = {
        let p = head
            .post(
                "/actions/plan",
                &json!({
                    "action_type": "order.submit.cl",
                    "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 1, "order_type": "market" },
                    "requested_by": "op-head-trader",
                    "chat_context": { "chat_session_id": "chat-h", "tool_call_id": "call-h" }
                }),
            )
            .await;
        assert_eq!(p.status, 200, "{:?}", p.body);
        p.plan_id()
    };
    let (trader, _) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let (checker, _) = signed_in(&s, "op-head-2", "head_trader", "").await;
    let text = |a: airlock_tests::passkey::Answer| a.body["text"].as_str().unwrap().to_string();
    let list = text(trader.get("/approvals").await);
    let (small, large) = (
        list.find(&own_small).expect("own small plan listed"),
        list.find(&own_large).expect("own large plan listed"),
    );
    assert!(large < small, "newest first: {list}");
    assert!(!list.contains(&heads_small), "{list}");
    let list = text(checker.get("/approvals").await);
    assert!(list.contains(&own_large), "four eyes of the desk: {list}");
    assert!(
        !list.contains(&own_small),
        "not four eyes, not theirs: {list}"
    );
    assert!(!list.contains(&heads_small), "{list}");
}

both!(a_revoked_operators_links_and_sessions_stay_dead);
/// Revoking an operator kills their unused links and every session they opened, for good;
/// a new link kills the earlier one. Each step is audited.
async fn a_revoked_operators_links_and_sessions_stay_dead(b: Backend) {
    let s = start(b, None);
    let t = s.trader();
    let open = |link: &str| {
        let path = link.split_once("/approvals/").unwrap().1.to_string();
        format!("/approvals/{path}")
    };
    let l1 = enroll(&s, "op9", "trader", "energy");
    assert!(
        s.cli(&["operators", "list"]).contains("link open until"),
        "the open link is listed"
    );
    s.cli(&["operators", "revoke", "--sub", "op9"]);
    let l2 = enroll(&s, "op9", "trader", "energy");
    let c = ApprovalClient::new(&s.base);
    for path in [open(&l1)] {
        assert_eq!(c.get(&path).await.status, 404, "a link revoked");
        let r = c.post(&format!("{path}/start"), json!({})).await;
        assert_eq!(r.status, 404, "{}", r.body);
        assert_eq!(r.body["error"]["code"], "enrolment_not_found");
    }
    // A new link kills the earlier unused one.
    let l3 = enroll(&s, "op9", "trader", "energy");
    let r = c.post(&format!("{}/start", open(&l2)), json!({})).await;
    assert_eq!(r.status, 404, "a link replaced: {}", r.body);
    let mut c3 = ApprovalClient::new(&s.base);
    let mut key = Passkey::new();
    assert_eq!(c3.enroll(&l3, &mut key).await.status, 200);
    assert!(!s.cli(&["operators", "list"]).contains("link open until"));
    let pid = plan(&t, 1).await.plan_id();
    assert_eq!(c3.get(&format!("/approvals/plans/{pid}")).await.status, 200);

    // Revoked: the session is dead, and stays dead after the operator is enrolled again.
    s.cli(&["operators", "revoke", "--sub", "op9"]);
    assert_eq!(c3.get("/approvals").await.status, 303);
    let l4 = enroll(&s, "op9", "head_trader", "");
    assert_eq!(
        c3.get("/approvals").await.status,
        303,
        "an old session came back"
    );
    assert_eq!(c3.decide(&pid, "approved", &mut key).await.status, 401);
    // The old passkey was forgotten: it cannot sign in.
    let mut c4 = ApprovalClient::new(&s.base);
    assert_eq!(c4.sign_in("op9", &mut key).await.status, 422);
    let mut key4 = Passkey::new();
    assert_eq!(c4.enroll(&l4, &mut key4).await.status, 200);
    assert_eq!(c4.get("/approvals").await.status, 200);

    // (The CLI's clock and the server's are both pinned near market open: the records
    // are compared as a set, not in time order.)
    let mut trail: Vec<String> = audit(&s, "operator:op9")
        .iter()
        .map(|r| r["decision"].as_str().unwrap().to_string())
        .collect();
    trail.sort();
    let mut want = vec![
        "created",
        "revoked",
        "re_enrolled",
        "link_issued",
        "passkey_registered",
        "revoked",
        "re_enrolled",
        "passkey_registered",
    ];
    want.sort();
    assert_eq!(trail, want);
}

both!(sign_in_tells_strangers_nothing_and_stores_nothing_for_them);
/// Sign-in answers an unknown operator id as it answers an enrolled one, stores nothing
/// for a request that has not signed in, and a sign-in is used once.
async fn sign_in_tells_strangers_nothing_and_stores_nothing_for_them(b: Backend) {
    let s = start(b, None);
    let (_, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let c = ApprovalClient::new(&s.base);
    let before = s.stored_approval_docs("challenge").await;
    let start = |sub: &'static str| {
        let c = &c;
        async move {
            let r = c
                .post("/approvals/login/start", json!({ "operator_id": sub }))
                .await;
            assert_eq!(r.status, 200, "{sub}: {}", r.body);
            r.body
        }
    };
    fn shape(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().take(1).map(shape).collect()),
            Value::String(_) => json!("s"),
            Value::Number(_) => json!(0),
            other => other.clone(),
        }
    }
    let known = start("op-energy-trader").await;
    let unknown = start("op-nobody").await;
    assert_eq!(shape(&known), shape(&unknown), "{known} / {unknown}");
    let ids = |v: &Value| v["options"]["publicKey"]["allowCredentials"].clone();
    assert!(!ids(&unknown).as_array().unwrap().is_empty());
    assert_eq!(
        ids(&unknown),
        ids(&start("op-nobody").await),
        "stable decoys"
    );
    assert_ne!(ids(&unknown), ids(&start("op-nobody-2").await));
    for _ in 0..40 {
        start("op-energy-trader").await;
        start("op-nobody").await;
    }
    assert_eq!(
        s.stored_approval_docs("challenge").await,
        before,
        "sign-in starts store nothing"
    );
    // A sign-in's ticket is used once.
    let c2 = ApprovalClient::new(&s.base);
    let st = c2
        .post(
            "/approvals/login/start",
            json!({ "operator_id": "op-energy-trader" }),
        )
        .await;
    let cred = key.assert(&st.body["options"], &c2.origin);
    let finish = json!({ "challenge_id": st.body["challenge_id"], "credential": cred });
    let ok = c2.post("/approvals/login/finish", finish.clone()).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let replay = c2.post("/approvals/login/finish", finish).await;
    assert_eq!(replay.status, 422, "{}", replay.body);
    assert_eq!(replay.body["error"]["code"], "passkey_invalid");
    // A forged ticket is refused without a store lookup of what it names.
    let forged = c2
        .post(
            "/approvals/login/finish",
            json!({ "challenge_id": "eyJzIjoib3AtZW5lcmd5LXRyYWRlciJ9.AAAA", "credential": {} }),
        )
        .await;
    assert_eq!(forged.status, 422, "{}", forged.body);
    assert_eq!(forged.body["error"]["code"], "passkey_invalid");
}

both!(a_policy_tightened_after_the_plan_holds_at_execute);
async fn a_policy_tightened_after_the_plan_holds_at_execute(b: Backend) {
    // The confirmation mode and the four-eyes rule are fixed on a plan when it is made; a
    // plan confirmed the looser way under an earlier policy is closed at execute, not
    // executed, and nothing is queued.
    let s = start(b, None);
    let t = s.trader();
    let dir = s.state_dir.clone();
    let policy = |name: &str, body: Value| {
        let file = dir.join(name);
        std::fs::write(&file, body.to_string()).unwrap();
        file.to_str().unwrap().to_string()
    };

    // Four eyes set after the requester approved alone.
    let p = plan(&t, 2).await;
    let pid = p.plan_id();
    assert_eq!(p["approval"]["four_eyes"], false, "{:?}", p.body);
    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let a = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let four_eyes = policy(
        "four-eyes.json",
        json!({ "version": "four-eyes", "four_eyes_above_notional": "100000" }),
    );
    s.cli(&["policy", "set", &four_eyes]);
    let e = t.execute_untokened(&pid, "k-tight-4e").await;
    closed_because(&e, "second person's approval");
    // Closed: another key does not get it through either.
    let again = t.execute_untokened(&pid, "k-tight-4e-2").await;
    assert_eq!(again.code(), "plan_not_executable", "{:?}", again.body);
    let trail = audit(&s, &pid);
    assert!(
        trail
            .iter()
            .any(|r| r["decision"] == "rejected" && r["reason_code"] == "plan_not_executable"),
        "{trail:?}"
    );
    // An order under the threshold, planned and approved under it, still executes.
    let small = policy(
        "four-eyes-high.json",
        json!({ "version": "four-eyes-high", "four_eyes_above_notional": "100000000" }),
    );
    s.cli(&["policy", "set", &small]);
    let p = plan(&t, 1).await;
    let ok_id = p.plan_id();
    assert_eq!(p["approval"]["four_eyes"], false, "{:?}", p.body);
    assert_eq!(c.decide(&ok_id, "approved", &mut key).await.status, 200);
    let ok = t.execute_untokened(&ok_id, "k-tight-under").await;
    assert_eq!(ok.status, 202, "{:?}", ok.body);

    // A token plan, when the policy in force has since moved the action to the approval
    // page: the valid token no longer executes it.
    let token = policy(
        "token.json",
        json!({ "version": "token", "confirmation": { "order.submit.cl": "token" } }),
    );
    s.cli(&["policy", "set", &token]);
    let p = plan(&t, 1).await;
    assert!(p["confirmation_token"].is_string(), "{:?}", p.body);
    s.cli(&["policy", "reset"]);
    let e = t.execute(&p, "k-tight-token").await;
    closed_because(&e, "approved by its operator on the approval page");
    for closed in [pid, p.plan_id()] {
        assert!(
            !audit(&s, &closed).iter().any(|r| r["decision"] == "queued"),
            "{closed} was queued"
        );
    }
    let _ = key.id();
}

/// A 422 `plan_not_executable` whose message says `why`.
fn closed_because(e: &Resp, why: &str) {
    assert_eq!(e.status, 422, "{:?}", e.body);
    assert_eq!(e.code(), "plan_not_executable");
    let message = e.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{:?}", e.body);
}

both!(a_change_of_an_order_is_approved_seeing_before_and_after);
async fn a_change_of_an_order_is_approved_seeing_before_and_after(b: Backend) {
    // New orders on the token path; a change of one on the approval page (the default).
    let stack = Stack::new(b).operator_mode();
    std::fs::write(
        stack.state_dir.join("policy.json"),
        r#"{"confirmation": {"order.submit.cl": "token"}}"#,
    )
    .expect("policy.json");
    let s = stack.start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_WORKERS", "on"),
        ("AIRLOCK_WORKER_RETRY_MS", "100"),
    ]);
    let t = s.trader();
    let order = json!({"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 2,
                       "order_type": "limit", "limit_price": "66.00", "time_in_force": "gtc"});
    let p = t
        .post("/actions/plan", &json!({"action_type": "order.submit.cl", "payload": order, "requested_by": "op-energy-trader"}))
        .await;
    let e = t.execute(&p, "chg-new").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let order_id = e["resource_refs"]["order_id"].as_str().unwrap().to_string();

    let change =
        json!({"account_id": "ACC-1", "order_id": order_id, "quantity": 3, "limit_price": "65.95"});
    let p = t
        .post("/actions/plan", &json!({"action_type": "order.replace.cl", "payload": change, "requested_by": "op-energy-trader"}))
        .await;
    assert_eq!(p["executable"], true, "{:?}", p.body);
    assert_eq!(
        p["confirmation_token"],
        Value::Null,
        "a change that adds risk is approved by a person"
    );
    let pid = p.plan_id();
    let (mut c, mut key) = signed_in(&s, "op-energy-trader", "trader", "energy").await;
    let html = c.get(&format!("/approvals/plans/{pid}")).await.body["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        html.contains(&format!(
            "Change order {order_id} on ACC-1: buy 2 -&gt; 3 CLF27, limit 66.00 -&gt; 65.95"
        )),
        "{html}"
    );
    for (field, before, after) in [
        ("quantity", "2", "3"),
        ("limit_price", "66.00", "65.95"),
        ("version", "1", "2"),
    ] {
        assert!(
            html.contains(&format!("<tr><th>{field}</th><td><span class=\"before\">{before}</span> &rarr; <strong class=\"after\">{after}</strong></td></tr>")),
            "{field}: {html}"
        );
    }
    assert!(
        html.contains("<tr><th>time_in_force</th><td>gtc</td></tr>"),
        "unchanged fields show once: {html}"
    );
    let a = c.decide(&pid, "approved", &mut key).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let e = t.execute_untokened(&pid, "chg-approved").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    assert_eq!(
        t.settled(e["action_id"].as_str().unwrap()).await["status"],
        "succeeded"
    );
    let o = t.order(&order_id).await;
    assert_eq!(
        (
            o["quantity"].as_u64(),
            o["limit_price"].as_str(),
            o["version"].as_u64()
        ),
        (Some(3), Some("65.95"), Some(2)),
        "{o}"
    );
}
