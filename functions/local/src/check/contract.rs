//! Answers against the contract: an object's keys, a listing page, the error body, and a
//! plan's failed checks.

use serde_json::Value;

use super::client::Answer;
use super::Outcome;

/// Every key present (`null` is a value).
pub(super) fn fields(v: &Value, what: &str, keys: &[&str]) -> Result<(), String> {
    let Some(obj) = v.as_object() else {
        return Err(format!("{what} is not a JSON object"));
    };
    let missing: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| !obj.contains_key(*k))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("{what} lacks {}", missing.join(", ")))
    }
}

pub(super) fn array<'a>(v: &'a Value, key: &str) -> Result<&'a Vec<Value>, String> {
    v[key]
        .as_array()
        .ok_or_else(|| format!("`{key}` is not an array"))
}

/// A listing page: 200, `<list>[]` whose rows have `keys`, and a `next_cursor` key.
pub(super) fn listing<'a>(
    a: &'a Answer,
    list: &str,
    keys: &[&str],
) -> Result<&'a Vec<Value>, String> {
    a.expect(200)?;
    fields(&a.body, "the page", &[list, "next_cursor"])?;
    let rows = array(&a.body, list)?;
    for r in rows {
        fields(r, &format!("a row of {list}"), keys)?;
    }
    Ok(rows)
}

/// The contract's error body: `error.code`, `error.message`, `error.details[].field` (the
/// expected field among them when given), `request_id` (the `x-request-id` header).
pub(super) fn error_shape(a: &Answer, status: u16, code: &str, field: Option<&str>) -> Outcome {
    if a.status != status || a.code() != code {
        return Err(format!("expected {status} {code}, got {}", a.brief()));
    }
    let e = &a.body["error"];
    if e["message"].as_str().is_none_or(str::is_empty) {
        return Err("error.message is missing or empty".into());
    }
    let details = match &e["details"] {
        Value::Null => Vec::new(),
        Value::Array(d) => d.clone(),
        _ => return Err("error.details is not an array".into()),
    };
    for d in &details {
        if d["field"].as_str().is_none() || d["message"].as_str().is_none() {
            return Err(format!("a detail lacks field or message: {d}"));
        }
    }
    if let Some(f) = field {
        if !details.iter().any(|d| d["field"] == f) {
            return Err(format!("error.details does not name {f}: {}", e["details"]));
        }
    }
    let Some(rid) = a.body["request_id"].as_str() else {
        return Err("request_id is missing".into());
    };
    if !rid.starts_with("req_") {
        return Err(format!("request_id {rid} is not a req_ id"));
    }
    if a.request_id.as_deref().is_some_and(|h| h != rid) {
        return Err(format!(
            "request_id {rid} differs from the x-request-id header"
        ));
    }
    Ok(match field {
        Some(f) => format!("{status} {code} at {f}"),
        None => format!("{status} {code}"),
    })
}

/// The failed checks of a plan, `name (reason)`, and whether they are only `market_open`.
pub(super) fn failed_checks(plan: &Value) -> (Vec<String>, bool) {
    let failed: Vec<&Value> = plan["risk_checks"]
        .as_array()
        .map(|c| c.iter().filter(|c| c["status"] == "fail").collect())
        .unwrap_or_default();
    let only_market = !failed.is_empty() && failed.iter().all(|c| c["name"] == "market_open");
    let named = failed
        .iter()
        .map(|c| {
            format!(
                "{} ({})",
                c["name"].as_str().unwrap_or("?"),
                c["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    (named, only_market)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_bodies_are_checked_against_the_contract() {
        let answer = |status: u16, body: Value, header: Option<&str>| Answer {
            status,
            text: body.to_string(),
            body,
            request_id: header.map(String::from),
        };
        let good = json!({"error": {"code": "invalid_request", "message": "Bad.",
            "details": [{"field": "/x", "message": "bad"}]}, "request_id": "req_1"});
        assert!(error_shape(
            &answer(400, good.clone(), Some("req_1")),
            400,
            "invalid_request",
            Some("/x")
        )
        .is_ok());
        for (a, why) in [
            (answer(400, good.clone(), Some("req_2")), "header"),
            (answer(422, good.clone(), None), "status"),
            (
                answer(
                    400,
                    json!({"error": {"code": "invalid_request"}, "request_id": "req_1"}),
                    None,
                ),
                "message",
            ),
            (
                answer(400, json!({"message": "Too Many Requests"}), None),
                "gateway body",
            ),
        ] {
            assert!(
                error_shape(&a, 400, "invalid_request", Some("/x")).is_err(),
                "{why}"
            );
        }
        assert!(error_shape(&answer(400, good, None), 400, "invalid_request", Some("/y")).is_err());
    }
}
