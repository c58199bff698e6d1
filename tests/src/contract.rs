//! Answers checked against the committed OpenAPI document (`docs/openapi.json`), with the
//! same JSON Schema engine Schemathesis uses. What a fuzzer cannot reach (a kill switch, an
//! expired token, a key in flight, an outage) is provoked by tests that check here that the
//! answer is one the document promises.

use std::sync::OnceLock;

use serde_json::{json, Value};

/// `docs/openapi.json`, parsed.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).expect("docs/openapi.json is JSON")
    })
}

/// The operation named `operation_id`: (path, method, operation).
pub fn operation(operation_id: &str) -> (String, String, &'static Value) {
    for (path, item) in document()["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if op["operationId"] == operation_id {
                return (path.clone(), method.clone(), op);
            }
        }
    }
    panic!("no operation {operation_id} in docs/openapi.json")
}

/// Validates `instance` against `schema`, whose references point into the document.
fn violations(schema: &Value, instance: &Value) -> Vec<String> {
    let mut root = schema.clone();
    if let Some(o) = root.as_object_mut() {
        o.insert("components".into(), document()["components"].clone());
        o.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
    }
    let validator = jsonschema::draft202012::new(&root).expect("a valid schema");
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Panics unless `status` is a documented answer of `operation_id` and `body` matches its
/// schema (for an error: the contract's error body, with a code documented for that
/// status). Returns the error code, if the body is an error.
pub fn check(operation_id: &str, status: u16, body: &Value) -> Option<String> {
    let (path, method, op) = operation(operation_id);
    let Some(answer) = op["responses"].get(status.to_string()) else {
        panic!(
            "{method} {path} answered {status}, which docs/openapi.json does not document: {body}"
        )
    };
    let schema = &answer["content"]["application/json"]["schema"];
    let v = violations(schema, body);
    assert!(
        v.is_empty(),
        "{method} {path} {status}: the body does not match docs/openapi.json: {v:?}\n{body}"
    );
    body["error"]["code"].as_str().map(String::from)
}

/// Panics unless `body` is the contract's error body (answers of routes outside the
/// document: the approval pages' JSON, an unknown path, a method a path does not take).
pub fn check_error(status: u16, body: &Value) -> String {
    let v = violations(&json!({"$ref": "#/components/schemas/Error"}), body);
    assert!(
        v.is_empty(),
        "{status}: not the contract's error body: {v:?}\n{body}"
    );
    body["error"]["code"].as_str().expect("a code").to_string()
}
