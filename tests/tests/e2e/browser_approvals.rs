//! The approval page in a real browser (headless Chromium with a virtual authenticator, on
//! both backends): an operator opens the admin's enrolment link and registers a passkey,
//! opens the URL a plan names and approves (execute then queues), declines another (execute
//! is refused), sees an expired plan with nothing left to approve, cannot approve their own
//! four-eyes order, and a head trader approves it from their pending list. Needs Chromium
//! and chromedriver (scripts/browser.sh, run by the test command); fails loudly without.

use std::time::Duration;

use airlock_tests::browser::Browser;
use airlock_tests::passkey::{enroll, origin_of as origin, ApprovalClient, Passkey};
use airlock_tests::{both, Api, Backend, Resp, Server, Stack, MARKET_OPEN};
use serde_json::{json, Value};

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
    let s = Server::operator_mode_at_open(backend);
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
        "Buy 1 CLF27 at market, protected: limit 68.90 (68.40 + 0.50) on ACC-1, day order.",
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

// ---- The page on a phone, its summary, its live list and accessibility ---------------------

/// axe-core as `scripts/node-deps.sh` installs it (tests/a11y, pinned).
const AXE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/a11y/node_modules/axe-core/axe.min.js"
);

/// Runs axe-core (every rule) on the page the browser shows and fails on any serious or
/// critical violation, printing them.
async fn axe_clean(b: &Browser, page: &str) {
    let src = std::fs::read_to_string(AXE).unwrap_or_else(|e| {
        panic!("{AXE}: {e}: run scripts/node-deps.sh, which installs axe-core into tests/a11y")
    });
    let loaded = b
        .execute(&format!("{src}\n;return typeof window.axe.run;"), vec![])
        .await;
    assert_eq!(loaded, json!("function"), "axe-core did not load");
    let r = b
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document).then((r) => done({
               rules: r.passes.length + r.violations.length,
               bad: r.violations
                 .filter((v) => v.impact === 'serious' || v.impact === 'critical')
                 .map((v) => ({ id: v.id, impact: v.impact, help: v.help,
                   nodes: v.nodes.map((n) => n.target.join(' ') + ': ' + n.failureSummary) })),
             })).catch((e) => done({ error: String(e) }));",
            vec![],
        )
        .await;
    assert!(
        r.get("error").is_none(),
        "axe-core failed on the {page} page: {r}"
    );
    assert!(
        r["rules"].as_u64().unwrap_or(0) > 10,
        "axe-core checked too little on the {page} page: {r}"
    );
    assert_eq!(
        r["bad"],
        json!([]),
        "axe-core: serious or critical violations on the {page} page:\n{}",
        serde_json::to_string_pretty(&r["bad"]).unwrap()
    );
}

/// Emulates a phone's screen (CSS pixels, touch, the page's viewport meta honoured).
async fn phone(b: &Browser, width: u32, height: u32) {
    b.cdp(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": true }),
    )
    .await;
}

async fn desktop(b: &Browser) {
    b.cdp("Emulation.clearDeviceMetricsOverride", json!({}))
        .await;
}

/// The page's width against the viewport's, after the layout settled.
async fn widths(b: &Browser) -> (f64, f64) {
    let v = b
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth];",
            vec![],
        )
        .await;
    (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
}

/// Where an element is on the page, scrolled to the top: `[top, bottom]` in CSS pixels.
async fn extent(b: &Browser, css: &str) -> (f64, f64) {
    let v = b
        .execute(
            "window.scrollTo(0, 0);
             const e = document.querySelector(arguments[0]);
             if (!e) return null;
             const r = e.getBoundingClientRect();
             return [r.top + window.scrollY, r.bottom + window.scrollY];",
            vec![json!(css)],
        )
        .await;
    assert!(!v.is_null(), "no {css} on the page");
    (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
}

/// Visible controls shorter than 44 CSS pixels (a finger's tap target).
async fn small_targets(b: &Browser) -> Value {
    b.execute(
        "return Array.from(document.querySelectorAll('button, a, summary, input'))
           .filter((e) => e.getClientRects().length > 0)
           .map((e) => [e.id || e.textContent.trim().slice(0, 40), e.getBoundingClientRect().height])
           .filter(([, h]) => h < 44);",
        vec![],
    )
    .await
}

/// Presses one key (a WebDriver key code such as "\u{E004}", Tab) on the focused element.
async fn press(b: &Browser, key: &str) {
    b.command(
        airlock_tests::browser::Method::POST,
        "/actions",
        Some(
            json!({ "actions": [{ "type": "key", "id": "keyboard", "actions": [
            { "type": "keyDown", "value": key }, { "type": "keyUp", "value": key }
        ] }] }),
        ),
    )
    .await
    .expect("key press");
}

/// Shift+Tab: focus moves backwards.
async fn shift_tab(b: &Browser) {
    b.command(
        airlock_tests::browser::Method::POST,
        "/actions",
        Some(
            json!({ "actions": [{ "type": "key", "id": "keyboard", "actions": [
            { "type": "keyDown", "value": "\u{E008}" }, { "type": "keyDown", "value": TAB },
            { "type": "keyUp", "value": TAB }, { "type": "keyUp", "value": "\u{E008}" }
        ] }] }),
        ),
    )
    .await
    .expect("shift+tab");
}

/// What has the keyboard focus: its id, else its text.
async fn focused(b: &Browser) -> String {
    b.execute(
        "const e = document.activeElement;
         return e ? (e.id || e.textContent.trim()) : '';",
        vec![],
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_string()
}

const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";

async fn plan_limit(t: &Api, qty: u32, price: &str) -> Resp {
    let p = t
        .post(
            "/actions/plan",
            &json!({
                "action_type": "order.submit.cl",
                "payload": { "account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": qty,
                             "order_type": "limit", "limit_price": price },
                "requested_by": "op-energy-trader",
                "chat_context": { "chat_session_id": "chat-42", "tool_call_id": "call-7" }
            }),
        )
        .await;
    assert_eq!(p.status, 200, "{:?}", p.body);
    assert_eq!(p["executable"], true, "{:?}", p.body["risk_checks"]);
    p
}

/// Where the README's pictures of the plan page go (written by the embedded run only).
fn image(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/images")
        .join(name)
}

both!(the_plan_page_leads_with_the_decision_on_a_phone);
/// The plan page on a 390 x 844 phone: the order's sentence, its notional, the reference
/// price, every warning and both buttons (naming the order) fit the first screen; warnings
/// come before the passed checks, which are collapsed; nothing overflows at 360 px; every
/// control is a 44 px target; the keyboard reaches the decision in order and approves with
/// Enter; axe-core finds nothing serious on any page (sign-in, enrolment, pending, plan,
/// error). The embedded run writes the README's screenshots.
async fn the_plan_page_leads_with_the_decision_on_a_phone(backend: Backend) {
    let s = Server::operator_mode_at_open(backend);
    let t = s.trader();
    let mut b = Browser::start().await;
    b.add_virtual_authenticator().await;

    let p = plan_limit(&t, 3, "67.85").await;
    let url = p["approval"]["url"].as_str().unwrap().to_string();
    let checks = p["risk_checks"].as_array().unwrap().clone();
    let count = |status: &str| checks.iter().filter(|c| c["status"] == status).count();
    let warned: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] != "pass")
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        !warned.is_empty(),
        "the picture needs a warning: {checks:?}"
    );

    b.goto(&url).await;
    b.wait_for("#login", WAIT).await;
    axe_clean(&b, "sign-in").await;
    let link = enroll(&s, "op-energy-trader", "trader", "energy");
    b.goto(&link).await;
    b.wait_for("#enroll", WAIT).await;
    axe_clean(&b, "enrolment").await;
    b.click("#enroll").await;
    b.wait_for("#pending-page", WAIT).await;
    axe_clean(&b, "pending").await;

    b.goto(&url).await;
    b.wait_for_text("#preview", "Buy 3 CLF27 limit 67.85", WAIT)
        .await;
    axe_clean(&b, "plan").await;

    // The summary: the money, the reference price, the warnings, the buttons that name it.
    let notional = b.text("#notional").await;
    assert!(notional.contains("$203,550"), "{notional}");
    assert!(notional.contains("3 x 1,000 bbl at 67.85"), "{notional}");
    // The reference price the band was measured from, now shown on its own.
    let shown = b.text("#reference").await;
    let price = shown.split(',').next().unwrap().trim().to_string();
    assert!(
        price.parse::<f64>().is_ok() && price.contains('.'),
        "a price: {shown}"
    );
    let band = checks
        .iter()
        .find(|c| c["name"] == "price_band")
        .expect("price_band check");
    assert!(
        band["reason"].as_str().unwrap().contains(&price),
        "{shown} is the band's reference: {band}"
    );
    // With its age: how long before the plan the price was observed.
    let age = b.text("#reference-age").await;
    assert!(age.ends_with(" old") && shown.contains(&age), "{shown}");
    assert_eq!(b.text("#approve").await, "Approve: buy 3 CLF27 @ 67.85");
    assert_eq!(b.text("#decline").await, "Decline: buy 3 CLF27 @ 67.85");
    for name in &warned {
        let row = format!("#warnings li[data-check='{name}']");
        assert!(b.exists(&row).await, "{name} is in the summary");
        assert!(
            extent(&b, &row).await.1 < extent(&b, "#passed").await.0,
            "{name}: warnings come before the passed checks"
        );
    }
    assert_eq!(
        b.text("#passed summary").await,
        format!("{} checks passed", count("pass"))
    );
    assert_eq!(
        b.execute("return document.getElementById('passed').open;", vec![])
            .await,
        json!(false),
        "passed checks are collapsed"
    );
    assert_eq!(
        b.execute(
            "return document.querySelectorAll('#checks tr.check').length;",
            vec![]
        )
        .await,
        json!(count("pass"))
    );

    // On a phone: the summary and both buttons within the first screen.
    phone(&b, 390, 844).await;
    b.goto(&url).await;
    b.wait_for("#approve", WAIT).await;
    let (page_w, view_w) = widths(&b).await;
    assert!(
        page_w <= view_w,
        "no horizontal scrolling at 390: {page_w} > {view_w}"
    );
    for css in [
        "#preview",
        "#notional",
        "#reference",
        "#time-left",
        "#warnings",
        "#approve",
        "#decline",
    ] {
        let (_, bottom) = extent(&b, css).await;
        assert!(
            bottom <= 844.0,
            "{css} ends at {bottom} px, below the first 844"
        );
    }
    assert_eq!(
        small_targets(&b).await,
        json!([]),
        "tap targets under 44 px"
    );
    axe_clean(&b, "plan (phone)").await;
    if backend == Backend::Embedded {
        let shot = image("approval-plan-phone.png");
        b.screenshot(&shot).await;
        let size = std::fs::metadata(&shot).unwrap().len();
        assert!(size < 200_000, "{} is {size} bytes", shot.display());
    }

    // 360 px: still no horizontal scrolling, on the plan and on the pending list.
    phone(&b, 360, 740).await;
    b.goto(&url).await;
    b.wait_for("#approve", WAIT).await;
    let (page_w, view_w) = widths(&b).await;
    assert!(page_w <= view_w, "plan page at 360: {page_w} > {view_w}");
    b.goto(&format!("{}/approvals", origin(&s))).await;
    b.wait_for("#pending li[data-plan-id]", WAIT).await;
    let (page_w, view_w) = widths(&b).await;
    assert!(page_w <= view_w, "pending list at 360: {page_w} > {view_w}");
    assert_eq!(
        small_targets(&b).await,
        json!([]),
        "tap targets under 44 px"
    );

    // The desktop picture.
    desktop(&b).await;
    b.goto(&url).await;
    b.wait_for("#approve", WAIT).await;
    if backend == Backend::Embedded {
        let shot = image("approval-plan-desktop.png");
        b.screenshot(&shot).await;
        let size = std::fs::metadata(&shot).unwrap().len();
        assert!(size < 200_000, "{} is {size} bytes", shot.display());
    }

    // The keyboard: the header's link and sign-out, then Approve and Decline, then the
    // passed checks; Enter on Approve approves.
    b.execute(
        "document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0);",
        vec![],
    )
    .await;
    let mut order = Vec::new();
    for _ in 0..5 {
        press(&b, TAB).await;
        order.push(focused(&b).await);
    }
    assert_eq!(
        order,
        vec![
            "Pending approvals".to_string(),
            "sign-out".into(),
            "approve".into(),
            "decline".into(),
            format!("{} checks passed", count("pass")),
        ]
    );
    // Back with Shift+Tab: Decline, then Approve.
    for _ in 0..2 {
        shift_tab(&b).await;
    }
    assert_eq!(focused(&b).await, "approve");
    press(&b, ENTER).await;
    b.wait_for_text("#state", "approved", WAIT).await;
    assert_eq!(
        execute(&t, &p, "browser-kbd").await.status,
        202,
        "approved with the keyboard"
    );

    // The error page.
    b.goto(&format!("{}/approvals/plans/pln_missing", origin(&s)))
        .await;
    b.wait_for("#error", WAIT).await;
    axe_clean(&b, "error").await;
    b.close().await;
}

/// Waits until `css` is gone from the page; the time it took.
async fn wait_gone(b: &Browser, css: &str, timeout: Duration) -> Duration {
    let start = std::time::Instant::now();
    while b.exists(css).await {
        assert!(
            start.elapsed() < timeout,
            "{css} still on the page after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    start.elapsed()
}

/// Waits until `css` is on the page; the time it took.
async fn wait_shown(b: &Browser, css: &str, timeout: Duration) -> Duration {
    let start = std::time::Instant::now();
    b.wait_for(css, timeout).await;
    start.elapsed()
}

fn row(p: &Resp) -> String {
    format!(
        "#pending li[data-plan-id='{}']",
        p["plan_id"].as_str().unwrap()
    )
}

both!(the_pending_list_updates_itself_and_a_decision_closes_when_decided_elsewhere);
/// The pending list updates itself without a reload: a new plan appears within 2 s (newest
/// first, with its notional, requester, chat, warnings and time left), a plan declined
/// elsewhere and a plan that expired leave; the empty list says why it is empty. A plan page
/// left open disables its buttons, with the reason, when the plan is declined elsewhere and
/// when it expires. Plans live 30 s here, so expiry is seen.
async fn the_pending_list_updates_itself_and_a_decision_closes_when_decided_elsewhere(
    backend: Backend,
) {
    let s = Stack::new(backend).operator_mode().start(&[
        ("AIRLOCK_NOW", MARKET_OPEN),
        ("AIRLOCK_CONFIRMATION_TTL_SECONDS", "30"),
    ]);
    let t = s.trader();
    let mut list = Browser::start().await;
    list.add_virtual_authenticator().await;
    enrol_in(
        &list,
        &enroll(&s, "op-energy-trader", "trader", "energy"),
        "op-energy-trader",
    )
    .await;
    // The same operator elsewhere (another device, its own passkey).
    let mut other = ApprovalClient::new(&s.base);
    let mut key = Passkey::new();
    let r = other
        .enroll(
            &enroll(&s, "op-energy-trader", "trader", "energy"),
            &mut key,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // Empty, and says why; the JSON behind it needs the session.
    assert!(list.exists("#pending #empty").await);
    assert!(list.text("#empty").await.contains("updates itself"));
    let anon = ApprovalClient::new(&s.base)
        .get("/approvals/pending.json")
        .await;
    assert_eq!(anon.status, 401, "{}", anon.body);
    assert_eq!(anon.body["error"]["code"], "sign_in_required");
    // A second window of the same session, for plan pages left open.
    let page = Browser::start().await;
    page.goto(&format!("{}/approvals", origin(&s))).await;
    let cookie = list.cookie("airlock_approvals").await.expect("session");
    page.add_cookie_object(json!({
        "name": "airlock_approvals", "value": cookie["value"], "path": "/approvals",
        "httpOnly": true, "sameSite": "Strict"
    }))
    .await;
    list.execute("window.__notReloaded = true;", vec![]).await;

    // A new plan appears within 2 s, without a reload.
    let a = plan_limit(&t, 3, "67.85").await;
    let took = wait_shown(&list, &row(&a), WAIT).await;
    assert!(took <= Duration::from_secs(2), "appeared after {took:?}");
    assert!(!list.exists("#pending #empty").await);
    let text = list.text(&row(&a)).await;
    for part in [
        "Buy 3 CLF27 limit 67.85",
        "$203,550",
        "op-energy-trader (you)",
        "chat-42",
        " s",
    ] {
        assert!(text.contains(part), "{part:?} in {text:?}");
    }
    let warnings = a["risk_checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "pass")
        .count();
    let shown = list.text(&format!("{} .warnings", row(&a))).await;
    assert_eq!(
        shown,
        if warnings == 0 {
            "none".to_string()
        } else {
            warnings.to_string()
        }
    );
    page.goto(a["approval"]["url"].as_str().unwrap()).await;
    page.wait_for("#approve", WAIT).await;
    assert_eq!(
        page.attribute("#approve", "disabled").await,
        None,
        "enabled while pending"
    );
    let left = list.text(&format!("{} .left", row(&a))).await;
    let secs: u32 = left.trim_end_matches(" s").parse().unwrap();
    assert!((1..=30).contains(&secs), "{left}");

    // Newest first.
    let b = plan(&t, 1).await;
    let took = wait_shown(&list, &row(&b), WAIT).await;
    assert!(took <= Duration::from_secs(2), "appeared after {took:?}");
    let first = list
        .attribute("#pending li[data-plan-id]", "data-plan-id")
        .await;
    assert_eq!(first.as_deref(), b["plan_id"].as_str(), "newest first");

    // Declined elsewhere: it leaves.
    let d = other
        .decide(b["plan_id"].as_str().unwrap(), "declined", &mut key)
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    let took = wait_gone(&list, &row(&b), WAIT).await;
    assert!(took <= Duration::from_secs(2), "left after {took:?}");

    // The plan page of the first plan, left open until the plan expires: its buttons are
    // disabled, with the reason; and the expired plan leaves the list.
    page.wait_for("#approve[disabled]", Duration::from_secs(40))
        .await;
    assert!(page.exists("#decline[disabled]").await);
    assert!(page.text("#why-not").await.contains("expired"));
    assert_eq!(page.text("#state").await, "expired");
    wait_gone(&list, &row(&a), Duration::from_secs(5)).await;
    wait_shown(&list, "#pending #empty", Duration::from_secs(5)).await;
    assert_eq!(
        list.execute("return window.__notReloaded === true;", vec![])
            .await,
        json!(true),
        "the list changed without a reload"
    );
    axe_clean(&list, "pending (updated)").await;

    // A plan page left open while the plan is declined elsewhere: its buttons are disabled
    // and it says why.
    let c = plan(&t, 1).await;
    page.goto(c["approval"]["url"].as_str().unwrap()).await;
    page.wait_for("#approve", WAIT).await;
    let d = other
        .decide(c["plan_id"].as_str().unwrap(), "declined", &mut key)
        .await;
    assert_eq!(d.status, 200, "{}", d.body);
    page.wait_for("#approve[disabled]", WAIT).await;
    assert!(page.exists("#decline[disabled]").await);
    let why = page.text("#why-not").await;
    assert!(why.contains("already declined"), "{why}");
    assert_eq!(page.text("#state").await, "declined");
    page.close().await;
    list.close().await;
}
