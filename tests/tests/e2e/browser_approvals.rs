//! The approval page in a real browser (headless Chromium with a virtual authenticator, on
//! both backends): an operator opens the admin's enrolment link and registers a passkey,
//! opens the URL a plan names and approves (execute then queues), declines another (execute
//! is refused), sees an expired plan with nothing left to approve, cannot approve their own
//! four-eyes order, and a head trader approves it from their pending list. Needs Chromium
//! and chromedriver (scripts/browser.sh, run by the test command); fails loudly without.

use std::time::Duration;

use airlock_tests::browser::Browser;
use airlock_tests::passkey::{enroll, origin_of as origin};
use airlock_tests::{both, Api, Backend, Resp, Stack, MARKET_OPEN};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

async fn plan(t: &Api, qty: u32) -> Resp {
    let p = t.plan_buy("CLF27", qty).await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    p
}

async fn execute(t: &Api, p: &Resp, key: &str) -> Resp {
    t.post(
        "/actions/execute",
        &json!({ "plan_id": p["plan_id"], "idempotency_key": key, "requested_by": "op-energy-trader" }),
    )
    .await
}

/// Opens an enrolment link and registers the browser's passkey; lands on the pending list.
async fn enrol_in(b: &Browser, link: &str, sub: &str) {
    b.goto(link).await;
    b.wait_for_text("#enrol-sub", sub, WAIT).await;
    b.click("#enroll").await;
    b.wait_for("#pending-page", WAIT).await;
    assert_eq!(b.text("#who").await, sub);
}

both!(an_operator_approves_and_declines_on_the_page);
async fn an_operator_approves_and_declines_on_the_page(backend: Backend) {
    let s = Stack::new(backend)
        .operator_mode()
        .start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let mut b = Browser::start().await;
    b.add_virtual_authenticator().await;

    // The URL alone shows nothing: a sign-in page.
    let p = plan(&t, 1).await;
    let url = p["approval"]["url"]
        .as_str()
        .expect("approval url")
        .to_string();
    b.goto(&url).await;
    b.wait_for("#login", WAIT).await;
    assert!(!b.page_source().await.contains("CLF27"));

    enrol_in(
        &b,
        &enroll(&s, "op-energy-trader", "trader", "energy"),
        "op-energy-trader",
    )
    .await;
    assert_eq!(b.credentials().await.len(), 1);
    let cookie = b.cookie("airlock_approvals").await.expect("session cookie");
    assert_eq!(cookie["httpOnly"], true);
    assert_eq!(cookie["sameSite"], "Strict");

    // Approve: what the operator sees is the plan's preview, checks and who asked.
    assert!(b
        .page_source()
        .await
        .contains(p["plan_id"].as_str().unwrap()));
    b.goto(&url).await;
    b.wait_for_text(
        "#preview",
        "Buy 1 CLF27 at market on ACC-1, day order.",
        WAIT,
    )
    .await;
    assert_eq!(b.text("#requested-by").await, "op-energy-trader");
    assert!(b.exists("#checks tr.check").await);
    assert_eq!(
        execute(&t, &p, "browser-1").await.code(),
        "approval_required"
    );
    b.click("#approve").await;
    b.wait_for_text("#state", "approved", WAIT).await;
    let e = execute(&t, &p, "browser-1").await;
    assert_eq!(e.status, 202, "{:?}", e.body);

    // Decline: execute is refused, for good.
    let d = plan(&t, 1).await;
    b.goto(d["approval"]["url"].as_str().unwrap()).await;
    b.wait_for("#decline", WAIT).await;
    b.click("#decline").await;
    b.wait_for_text("#state", "declined", WAIT).await;
    let e = execute(&t, &d, "browser-2").await;
    assert_eq!(e.code(), "plan_declined", "{:?}", e.body);

    // Without user verification the authenticator cannot approve.
    let u = plan(&t, 1).await;
    b.set_user_verified(false).await;
    b.goto(u["approval"]["url"].as_str().unwrap()).await;
    b.wait_for("#approve", WAIT).await;
    b.click("#approve").await;
    b.wait_for_text("#status", "NotAllowedError", WAIT).await;
    b.set_user_verified(true).await;
    assert_eq!(
        execute(&t, &u, "browser-3").await.code(),
        "approval_required"
    );

    // Later, past its expiry: the page says so and offers nothing to approve.
    let late = plan(&t, 1).await;
    let stack = s.crash();
    let s = stack.start(&[("AIRLOCK_NOW", "2026-11-23T15:09:00Z")]);
    let t = s.trader();
    // The restarted server listens on another port: the same plan's page there.
    let late_url = format!(
        "{}/approvals/plans/{}",
        origin(&s),
        late["plan_id"].as_str().unwrap()
    );
    b.goto(&late_url).await;
    b.wait_for_text("#state", "expired", WAIT).await;
    assert!(!b.exists("#approve").await);
    assert_eq!(execute(&t, &late, "browser-4").await.code(), "plan_expired");
    b.close().await;
}

both!(four_eyes_in_the_browser);
async fn four_eyes_in_the_browser(backend: Backend) {
    let stack = Stack::new(backend).operator_mode();
    std::fs::write(
        stack.state_dir.join("policy.json"),
        r#"{"four_eyes_above_notional": "100000"}"#,
    )
    .unwrap();
    let s = stack.start(&[("AIRLOCK_NOW", MARKET_OPEN)]);
    let t = s.trader();
    let p = plan(&t, 2).await;
    assert_eq!(p["approval"]["four_eyes"], true);
    let url = p["approval"]["url"].as_str().unwrap().to_string();

    let mut trader = Browser::start().await;
    trader.add_virtual_authenticator().await;
    enrol_in(
        &trader,
        &enroll(&s, "op-energy-trader", "trader", "energy"),
        "op-energy-trader",
    )
    .await;
    // Maker and checker: the requester approves first, and that is not enough.
    trader.goto(&url).await;
    trader.wait_for("#four-eyes", WAIT).await;
    assert!(trader
        .text("#still-needed")
        .await
        .contains("a second operator"));
    trader.click("#approve").await;
    trader
        .wait_for_text("#approved-by", "op-energy-trader", WAIT)
        .await;
    assert_eq!(trader.text("#state").await, "pending");
    assert!(!trader.exists("#approve").await, "nobody approves twice");
    assert_eq!(
        execute(&t, &p, "browser-4e").await.code(),
        "approval_required"
    );
    trader.close().await;

    let mut head = Browser::start().await;
    head.add_virtual_authenticator().await;
    enrol_in(
        &head,
        &enroll(&s, "op-head-trader", "head_trader", ""),
        "op-head-trader",
    )
    .await;
    let link = format!(
        "a.plan[href='/approvals/plans/{}']",
        p["plan_id"].as_str().unwrap()
    );
    assert!(
        head.exists(&link).await,
        "in the head trader's pending list"
    );
    head.click(&link).await;
    head.wait_for("#approve", WAIT).await;
    head.click("#approve").await;
    head.wait_for_text("#state", "approved", WAIT).await;
    let e = execute(&t, &p, "browser-4e").await;
    assert_eq!(e.status, 202, "{:?}", e.body);
    head.close().await;
}
