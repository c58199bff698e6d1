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
