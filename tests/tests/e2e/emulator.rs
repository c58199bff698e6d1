//! The AWS emulator harness (tests/src/moto.rs): starts moto_server, serves AWS APIs on its
//! endpoint, and is gone after drop.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use airlock_tests::moto::Moto;

/// A SigV4-shaped Authorization header: moto routes by its credential scope and does not
/// check the signature.
fn auth(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=test/20260101/{}/{service}/aws4_request, \
         SignedHeaders=host;x-amz-date, Signature=0000",
        Moto::REGION
    )
}

#[tokio::test]
async fn moto_starts_answers_and_stops_on_drop() {
    let Some(moto) = Moto::start_or_skip() else {
        return;
    };
    assert!(moto.is_up(), "moto answers on {}", moto.endpoint);
    let pid = moto.pid().expect("running");
    let port = moto.port;

    let env = moto.env();
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{k} in env()"))
    };
    assert_eq!(get("AWS_ENDPOINT_URL"), moto.endpoint);
    assert_eq!(get("AWS_ACCESS_KEY_ID"), "test");
    assert_eq!(get("AWS_SECRET_ACCESS_KEY"), "test");
    assert_eq!(get("AWS_REGION"), "us-east-1");
    assert_eq!(get("AWS_EC2_METADATA_DISABLED"), "true");

    // A real AWS JSON-protocol call: DynamoDB ListTables on an empty server.
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/", moto.endpoint))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", "DynamoDB_20120810.ListTables")
        .header("x-amz-date", "20260101T000000Z")
        .header("authorization", auth("dynamodb"))
        .body("{}")
        .send()
        .await
        .expect("ListTables");
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["TableNames"], serde_json::json!([]), "{body}");

    // State survives between calls and reset() wipes it.
    let create = |name: &str| {
        http.post(format!("{}/", moto.endpoint))
            .header("content-type", "application/x-amz-json-1.0")
            .header("x-amz-target", "AmazonSQS.CreateQueue")
            .header("x-amz-date", "20260101T000000Z")
            .header("authorization", auth("sqs"))
            .body(serde_json::json!({ "QueueName": name }).to_string())
            .send()
    };
    let r = create("probe").await.expect("CreateQueue");
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        body["QueueUrl"],
        format!("{}/{}/probe", moto.endpoint, Moto::ACCOUNT_ID),
        "{body}"
    );
    moto.reset();
    assert!(moto.is_up());

    drop(moto);
    // Killed and reaped: no process, no listener.
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "moto_server pid {pid} still exists after drop"
    );
    assert!(
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_secs(1)
        )
        .is_err(),
        "port {port} still accepts connections after drop"
    );
}

/// One AWS JSON call to `moto`; the parsed answer.
async fn call(
    moto: &Moto,
    service: &str,
    target: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let content_type = if service == "dynamodb" || service == "sqs" {
        "application/x-amz-json-1.0"
    } else {
        "application/x-amz-json-1.1"
    };
    let r = reqwest::Client::new()
        .post(format!("{}/", moto.endpoint))
        .header("content-type", content_type)
        .header("x-amz-target", target)
        .header("x-amz-date", "20260101T000000Z")
        .header("authorization", auth(service))
        .body(body.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{target}: {e}"));
    assert_eq!(r.status().as_u16(), 200, "{target}");
    r.json().await.expect("json")
}

/// The tables of `moto`.
async fn tables(moto: &Moto) -> serde_json::Value {
    call(
        moto,
        "dynamodb",
        "DynamoDB_20120810.ListTables",
        serde_json::json!({}),
    )
    .await["TableNames"]
        .clone()
}

/// Servers started one after another, or side by side, share nothing: with the test
/// command's zygote (`AIRLOCK_MOTO_ZYGOTE`) each is a fork of one warmed process, and the
/// warm-up's key and calls must not show in any of them.
#[tokio::test]
async fn every_server_starts_empty_and_alone() {
    let Some(first) = Moto::start_or_skip() else {
        return;
    };
    let Some(second) = Moto::start_or_skip() else {
        return;
    };
    if std::env::var_os("AIRLOCK_MOTO_ZYGOTE").is_some_and(|z| !z.is_empty()) {
        // Forked by the zygote, not spawned by this process.
        let pid = first.pid().expect("running");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let ppid: u32 = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .expect("ppid");
        assert_ne!(
            ppid,
            std::process::id(),
            "the server is this test's own child"
        );
    }
    for m in [&first, &second] {
        let keys = call(m, "kms", "TrentService.ListKeys", serde_json::json!({})).await;
        assert_eq!(keys["Keys"], serde_json::json!([]), "{keys}");
        let queues = call(m, "sqs", "AmazonSQS.ListQueues", serde_json::json!({})).await;
        assert!(
            queues
                .get("QueueUrls")
                .is_none_or(|q| q == &serde_json::json!([])),
            "{queues}"
        );
    }
    call(
        &first,
        "dynamodb",
        "DynamoDB_20120810.CreateTable",
        serde_json::json!({
            "TableName": "only-in-first",
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
            "BillingMode": "PAY_PER_REQUEST"
        }),
    )
    .await;
    call(
        &first,
        "kms",
        "TrentService.CreateKey",
        serde_json::json!({}),
    )
    .await;

    assert_eq!(tables(&first).await, serde_json::json!(["only-in-first"]));
    assert_eq!(tables(&second).await, serde_json::json!([]));
    let keys = call(
        &second,
        "kms",
        "TrentService.ListKeys",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(keys["Keys"], serde_json::json!([]), "{keys}");

    // A third server after the first is gone: empty too, and the second still answers.
    drop(first);
    let Some(third) = Moto::start_or_skip() else {
        return;
    };
    assert_eq!(tables(&third).await, serde_json::json!([]));
    assert!(second.is_up());
}
