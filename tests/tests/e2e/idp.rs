//! Production identity providers: tokens signed by an IdP's RS256/ES256 keys, verified
//! against its JWKS fetched over HTTP, cached, rotated by `kid`; issuer and audience per
//! token kind; the algorithm confusions refused; a Cognito-shaped configuration.

use airlock_tests::idp::{now_s, Idp, Key};
use airlock_tests::{forge, Api, Server, MARKET_OPEN};
use serde_json::{json, Value};

const SERVICE_ISS: &str = "https://idp.test/service";
const SERVICE_AUD: &str = "https://airlock.test/api";
const OPERATOR_ISS: &str = "https://idp.test/operators";
const OPERATOR_AUD: &str = "airlock-console";

fn env<'a>(idp: &'a Idp, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut e = vec![
        ("AIRLOCK_SERVICE_JWKS_URL", idp.url.as_str()),
        ("AIRLOCK_OPERATOR_JWKS_URL", idp.url.as_str()),
        ("AIRLOCK_SERVICE_ISSUER", SERVICE_ISS),
        ("AIRLOCK_SERVICE_AUDIENCE", SERVICE_AUD),
        ("AIRLOCK_OPERATOR_ISSUER", OPERATOR_ISS),
        ("AIRLOCK_OPERATOR_AUDIENCE", OPERATOR_AUD),
        ("AIRLOCK_JWKS_REFETCH_COOLDOWN_SECONDS", "1"),
    ];
    e.extend_from_slice(extra);
    e
}

fn service_claims(now: i64, jti: &str) -> Value {
    json!({ "iss": SERVICE_ISS, "aud": SERVICE_AUD, "sub": "mastra-agent", "jti": jti,
            "gty": "client-credentials",
            "scope": "trade.read trade.plan trade.execute", "iat": now, "exp": now + 600 })
}

fn operator_claims(now: i64) -> Value {
    json!({ "iss": OPERATOR_ISS, "aud": OPERATOR_AUD, "sub": "op-energy-trader",
            "roles": ["trader"], "desks": ["energy"], "iat": now, "exp": now + 3600 })
}

fn with(mut v: Value, k: &str, x: Value) -> Value {
    v[k] = x;
    v
}

fn account_ids(r: &airlock_tests::Resp) -> Vec<String> {
    r["accounts"]
        .as_array()
        .expect("accounts")
        .iter()
        .map(|a| a["account_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn provider_tokens_verify_and_every_forgery_is_refused() {
    let rsa = Key::rs256("svc-rsa-1");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start(&[&rsa, &ec]);
    let s = Server::start(&env(&idp, &[]));
    let now = now_s();
    let op = ec.sign(&operator_claims(now));
    let api = Api::new(&s, rsa.sign(&service_claims(now, "a")), op.clone());

    // RS256 service token + ES256 operator token, both from the JWKS.
    let r = api.get("/accounts").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(
        account_ids(&r),
        ["ACC-1", "ACC-2", "ACC-4"],
        "energy desk only"
    );
    for i in 0..20 {
        let fresh = api.with_tokens(&rsa.sign(&service_claims(now, &format!("t{i}"))), &op);
        assert_eq!(fresh.get("/accounts").await.status, 200);
    }
    assert_eq!(
        idp.fetches(),
        1,
        "the key set is cached, not fetched per token"
    );

    // The local dev issuer is no longer trusted once a provider is configured.
    let dev = api.with_tokens(&s.service_token(), &op);
    let r = dev.get("/accounts").await;
    assert_eq!((r.status, r.code()), (401, "unauthenticated"));

    let svc = service_claims(now, "x");
    let hmac_with_public_key = forge::hs256(&svc, Some("svc-rsa-1"), &rsa.public_der());
    let forged = Key::rs256("svc-rsa-1").sign(&svc);
    let refused: Vec<(&str, String)> = vec![
        ("wrong issuer", rsa.sign(&with(svc.clone(), "iss", json!("https://evil.test")))),
        ("wrong audience", rsa.sign(&with(svc.clone(), "aud", json!("other-api")))),
        ("operator audience", rsa.sign(&with(svc.clone(), "aud", json!(OPERATOR_AUD)))),
        ("expired", rsa.sign(&with(with(svc.clone(), "iat", json!(now - 1000)), "exp", json!(now - 100)))),
        ("lifetime over 15 min", rsa.sign(&with(svc.clone(), "exp", json!(now + 901)))),
        ("no exp", rsa.sign(&json!({"iss": SERVICE_ISS, "aud": SERVICE_AUD, "sub": "m", "iat": now, "scope": "trade.read"}))),
        ("alg none", forge::alg_none(&svc)),
        ("HS256 keyed with the RSA public key", hmac_with_public_key),
        ("forged signature under a known kid", forged),
        ("RS256 header on the EC key's kid", rsa.sign_as("RS256", "ops-ec-1", &svc)),
        ("ES256 header on the RSA key's kid", ec.sign_as("ES256", "svc-rsa-1", &svc)),
        ("unknown kid", Key::es256("not-published").sign(&svc)),
    ];
    for (what, token) in &refused {
        let r = api.with_tokens(token, &op).get("/accounts").await;
        assert_eq!(
            (r.status, r.code()),
            (401, "unauthenticated"),
            "{what}: {:?}",
            r.body
        );
    }
    assert!(
        idp.fetches() <= 2,
        "one refetch for the unknown kids at most, got {}",
        idp.fetches()
    );

    // Operator tokens: their own issuer and audience.
    let ok_service = rsa.sign(&service_claims(now, "y"));
    let opc = operator_claims(now);
    for (what, token) in [
        (
            "service issuer",
            ec.sign(&with(opc.clone(), "iss", json!(SERVICE_ISS))),
        ),
        (
            "service audience",
            ec.sign(&with(opc.clone(), "aud", json!(SERVICE_AUD))),
        ),
        ("alg none", forge::alg_none(&opc)),
    ] {
        let r = api.with_tokens(&ok_service, &token).get("/accounts").await;
        assert_eq!(
            (r.status, r.code()),
            (401, "operator_unauthenticated"),
            "{what}: {:?}",
            r.body
        );
    }
}

#[tokio::test]
async fn provider_tokens_plan_and_execute_a_trade() {
    let rsa = Key::rs256("svc-rsa-1");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start(&[&rsa, &ec]);
    let s = Server::start(&env(&idp, &[("AIRLOCK_NOW", MARKET_OPEN)]));
    // The server's clock starts at MARKET_OPEN; tokens are issued on that clock.
    let now = MARKET_OPEN_EPOCH_S;
    let api = Api::new(
        &s,
        rsa.sign(&service_claims(now, "p")),
        ec.sign(&operator_claims(now)),
    );
    let plan = api.plan_buy("CLF27", 1).await;
    assert_eq!(plan.status, 200, "{:?}", plan.body);
    let done = api.execute(&plan, "idp-exec-1").await;
    assert_eq!(done.status, 202, "{:?}", done.body);

    // Another provider operator (same desk, valid token) cannot execute that plan.
    let other = ec.sign(&with(operator_claims(now), "sub", json!("op-energy-2")));
    let plan2 = api.plan_buy("CLF27", 1).await;
    let r = api
        .with_tokens(&rsa.sign(&service_claims(now, "q")), &other)
        .execute(&plan2, "idp-exec-2")
        .await;
    assert_eq!(r.status, 403, "{:?}", r.body);
    assert_eq!(r.code(), "operator_mismatch");
    // Audited, naming who claimed to act for whom.
    let trail = s.audit(plan2["plan_id"].as_str().unwrap());
    let refusal = trail
        .iter()
        .find(|a| a["reason_code"] == "operator_mismatch")
        .unwrap_or_else(|| panic!("no operator_mismatch audit record: {trail:?}"));
    assert_eq!(refusal["operator_id"], "op-energy-2", "{refusal}");
    let reason = refusal["reason"].as_str().unwrap();
    assert!(
        reason.contains("\"op-energy-trader\"") && reason.contains("\"op-energy-2\""),
        "{reason}"
    );
}

/// MARKET_OPEN (2026-11-23T15:00:00Z) in seconds since the epoch.
const MARKET_OPEN_EPOCH_S: i64 = 1_795_446_000;

#[tokio::test]
async fn keys_rotate_by_kid_and_withdrawn_keys_stop_verifying() {
    let old = Key::rs256("svc-2026-10");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start(&[&old, &ec]);
    let s = Server::start(&env(&idp, &[]));
    let now = now_s();
    let op = ec.sign(&operator_claims(now));
    let api = Api::new(&s, old.sign(&service_claims(now, "1")), op.clone());
    assert_eq!(api.get("/accounts").await.status, 200);
    assert_eq!(idp.fetches(), 1);

    // The provider rotates: publishes the new key and withdraws the old one.
    let new = Key::rs256("svc-2026-11");
    idp.publish(&[&new, &ec]);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = api
        .with_tokens(&new.sign(&service_claims(now, "2")), &op)
        .get("/accounts")
        .await;
    assert_eq!(r.status, 200, "a new kid triggers a refetch: {:?}", r.body);
    assert_eq!(idp.fetches(), 2);
    let r = api
        .with_tokens(&old.sign(&service_claims(now, "3")), &op)
        .get("/accounts")
        .await;
    assert_eq!(
        (r.status, r.code()),
        (401, "unauthenticated"),
        "withdrawn key"
    );

    // A flood of unknown kids inside the cooldown costs no fetches.
    for i in 0..30 {
        let t = Key::es256(&format!("forged-{i}")).sign(&service_claims(now, "f"));
        let r = api.with_tokens(&t, &op).get("/accounts").await;
        assert_eq!(r.status, 401);
    }
    assert!(idp.fetches() <= 3, "fetches: {}", idp.fetches());
}

#[tokio::test]
async fn an_unreachable_provider_is_a_503_not_a_401() {
    let rsa = Key::rs256("svc-rsa-1");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start(&[&rsa, &ec]);
    idp.set_up(false);
    let s = Server::start(&env(&idp, &[]));
    let now = now_s();
    let api = Api::new(
        &s,
        rsa.sign(&service_claims(now, "1")),
        ec.sign(&operator_claims(now)),
    );
    let r = api.get("/accounts").await;
    r.assert_error(503, "upstream_unavailable");
    assert!(
        !r.body.to_string().contains("jwks.json"),
        "no internals in the body"
    );

    idp.set_up(true);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let r = api.get("/accounts").await;
    assert_eq!(
        r.status, 200,
        "recovers once the provider answers: {:?}",
        r.body
    );
}

#[tokio::test]
async fn cognito_shaped_tokens() {
    // Cognito: client-credentials access tokens carry `client_id` (no `aud`) and scopes
    // prefixed by the resource server; ID tokens carry `cognito:groups` and custom
    // attributes as strings.
    let pool = "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_TEST";
    let svc_key = Key::rs256("cognito-1");
    let idp = Idp::start(&[&svc_key]);
    let s = Server::start(&[
        ("AIRLOCK_SERVICE_JWKS_URL", idp.url.as_str()),
        ("AIRLOCK_OPERATOR_JWKS_URL", idp.url.as_str()),
        ("AIRLOCK_SERVICE_ISSUER", pool),
        ("AIRLOCK_OPERATOR_ISSUER", pool),
        ("AIRLOCK_SERVICE_AUDIENCE", "mastra-client-id"),
        ("AIRLOCK_SERVICE_AUDIENCE_CLAIM", "client_id"),
        ("AIRLOCK_SERVICE_SCOPE_PREFIX", "airlock/"),
        ("AIRLOCK_OPERATOR_AUDIENCE", "console-client-id"),
        ("AIRLOCK_OPERATOR_ROLES_CLAIM", "cognito:groups"),
        ("AIRLOCK_OPERATOR_DESKS_CLAIM", "custom:desks"),
        ("AIRLOCK_SERVICE_TOKEN_MARKER", "sub=@client_id"),
    ]);
    let now = now_s();
    let access = json!({ "iss": pool, "sub": "mastra-client-id", "client_id": "mastra-client-id",
        "token_use": "access", "scope": "airlock/trade.read airlock/trade.plan",
        "iat": now, "exp": now + 300 });
    let id = json!({ "iss": pool, "aud": "console-client-id", "sub": "op-metals-viewer",
        "token_use": "id", "cognito:groups": ["viewer"], "custom:desks": "metals",
        "iat": now, "exp": now + 3600 });
    let api = Api::new(&s, svc_key.sign(&access), svc_key.sign(&id));
    let r = api.get("/accounts").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(account_ids(&r), ["ACC-3"], "metals desk from custom:desks");

    // Another app client's token, and an unprefixed scope, are refused.
    let other = with(access.clone(), "client_id", json!("someone-else"));
    let r = api
        .with_tokens(&svc_key.sign(&other), &svc_key.sign(&id))
        .get("/accounts")
        .await;
    assert_eq!((r.status, r.code()), (401, "unauthenticated"));
    // A user's access token for the same app client (Cognito: `sub` is the user, not the
    // client): not a client-credentials token, refused as the service token.
    let user_access = json!({ "iss": pool, "sub": "5f1c2d3e-user", "client_id": "mastra-client-id",
        "username": "alice", "token_use": "access", "scope": "airlock/trade.read airlock/trade.plan",
        "iat": now, "exp": now + 300 });
    let r = api
        .with_tokens(&svc_key.sign(&user_access), &svc_key.sign(&id))
        .get("/accounts")
        .await;
    r.assert_error(401, "unauthenticated");
    assert!(
        r.message().contains("claim sub equal to claim client_id"),
        "{:?}",
        r.body
    );
    let unprefixed = with(access.clone(), "scope", json!("trade.read"));
    let r = api
        .with_tokens(&svc_key.sign(&unprefixed), &svc_key.sign(&id))
        .get("/accounts")
        .await;
    assert_eq!((r.status, r.code()), (403, "insufficient_scope"));
}

#[tokio::test]
async fn the_jwks_is_fetched_over_verified_https() {
    use airlock_tests::idp::test_ca_file;
    let rsa = Key::rs256("svc-rsa-1");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start_tls(&[&rsa, &ec]);
    assert!(idp.url.starts_with("https://127.0.0.1:"), "{}", idp.url);
    let ca = test_ca_file();
    let ca = ca.to_str().unwrap();
    let now = now_s();
    let tokens = |s: &Server| {
        Api::new(
            s,
            rsa.sign(&service_claims(now, "tls")),
            ec.sign(&operator_claims(now)),
        )
    };

    // Trusting the provider's CA: the key set comes over TLS and tokens verify.
    let s = Server::start(&env(&idp, &[("SSL_CERT_FILE", ca)]));
    let r = tokens(&s).get("/accounts").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(idp.fetches(), 1);
    drop(s);

    // Trusting other roots only (here: the server's own certificate, which is no CA): the
    // handshake fails, so no keys, 503; never a 401, never an unverified key set.
    let other_roots = test_ca_file().with_file_name("server.pem");
    let s = Server::start(&env(
        &idp,
        &[("SSL_CERT_FILE", other_roots.to_str().unwrap())],
    ));
    let r = tokens(&s).get("/accounts").await;
    r.assert_error(503, "upstream_unavailable");
    assert_eq!(
        idp.fetches(),
        1,
        "the handshake failed before any request was served"
    );
    let log = std::fs::read_to_string(s.state_dir.join("serve.log")).unwrap();
    assert!(
        log.contains("could not fetch identity provider keys") && log.contains("UnknownIssuer"),
        "the fetch failed on the certificate, it was not skipped"
    );
}

// A provider's token issued to a user (same issuer, same audience, even
// the trade scopes) must not pass as Mastra's client-credentials token, and a
// client-credentials token must not pass as an operator's. The marker that tells them
// apart is configuration (`AIRLOCK_SERVICE_TOKEN_MARKER`), `gty=client-credentials` by
// default (Auth0, and the dev issuer).
airlock_tests::both!(a_user_token_of_the_same_provider_is_not_the_service_token);
async fn a_user_token_of_the_same_provider_is_not_the_service_token(b: airlock_tests::Backend) {
    let rsa = Key::rs256("svc-rsa-1");
    let ec = Key::es256("ops-ec-1");
    let idp = Idp::start(&[&rsa, &ec]);
    let s = Server::start_on(b, &env(&idp, &[]));
    let now = now_s();
    let op = ec.sign(&operator_claims(now));
    let api = Api::new(&s, rsa.sign(&service_claims(now, "m")), op.clone());
    assert_eq!(api.get("/accounts").await.status, 200);

    // Auth0: a user's access token for the API, with the API's audience and scopes.
    let mut user = service_claims(now, "u");
    user.as_object_mut().unwrap().remove("gty");
    user["sub"] = json!("auth0|alice");
    for (what, claims) in [
        ("no gty", user.clone()),
        (
            "gty of a user's grant",
            with(user.clone(), "gty", json!("password")),
        ),
    ] {
        let r = api
            .with_tokens(&rsa.sign(&claims), &op)
            .get("/accounts")
            .await;
        assert_eq!(
            (r.status, r.code()),
            (401, "unauthenticated"),
            "{what}: {:?}",
            r.body
        );
        let m = r.body["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("not a client-credentials token")
                && m.contains("gty")
                && m.contains("AIRLOCK_SERVICE_TOKEN_MARKER"),
            "{what}: {m}"
        );
    }
    // The plan endpoint too, and nothing is planned.
    let r = api
        .with_tokens(&rsa.sign(&user), &op)
        .plan_sync("ACC-1")
        .await;
    assert_eq!((r.status, r.code()), (401, "unauthenticated"));

    // A client-credentials token is not an operator's, even with the operator audience.
    let machine_op = with(operator_claims(now), "gty", json!("client-credentials"));
    let r = api
        .with_tokens(&rsa.sign(&service_claims(now, "n")), &ec.sign(&machine_op))
        .get("/accounts")
        .await;
    r.assert_error(401, "operator_unauthenticated");
    assert!(r.message().contains("client-credentials (service) token"));

    // Entra ID: `idtyp=app` (optional claim) marks app-only tokens.
    let s = s
        .crash()
        .start(&env(&idp, &[("AIRLOCK_SERVICE_TOKEN_MARKER", "idtyp=app")]));
    let app = with(service_claims(now, "e1"), "idtyp", json!("app"));
    let r = Api::new(&s, rsa.sign(&app), op.clone())
        .get("/accounts")
        .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let delegated = with(service_claims(now, "e2"), "idtyp", json!("user"));
    let r = Api::new(&s, rsa.sign(&delegated), op.clone())
        .get("/accounts")
        .await;
    r.assert_error(401, "unauthenticated");
    assert!(r.message().contains("claim idtyp = \"app\""));
}
