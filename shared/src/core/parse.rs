//! Typed parsing of JSON values into domain types, shared by every front door (the HTTP
//! body extractor, the protocol's payload parsing): a failure names the JSON pointer of
//! the field that is wrong.

use serde::de::DeserializeOwned;

use crate::core::error::ApiError;

/// Deserializes a JSON value into `T`; `prefix` is the pointer of `value` in the request.
pub fn from_value<T: DeserializeOwned>(
    value: serde_json::Value,
    prefix: &str,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut pointer = prefix.to_string();
        for seg in e.path().iter() {
            use serde_path_to_error::Segment::*;
            match seg {
                Seq { index } => pointer.push_str(&format!("/{index}")),
                Map { key } => pointer.push_str(&format!("/{}", escape(key))),
                Enum { variant } => pointer.push_str(&format!("/{}", escape(variant))),
                Unknown => {}
            }
        }
        let inner = e.into_inner().to_string();
        // serde names unknown and missing fields in the message, not the path.
        let named = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|p| inner.strip_prefix(p))
            .and_then(|rest| rest.split('`').next());
        if let Some(name) = named {
            let last = format!("/{}", escape(name));
            if !pointer.ends_with(&last) {
                pointer.push_str(&last);
            }
        }
        ApiError::invalid_at(pointer, &clean_serde_message(&inner))
    })
}

/// Escapes a key for a JSON pointer segment (RFC 6901).
pub(crate) fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn clean_serde_message(m: &str) -> String {
    let m = m.split(" at line ").next().unwrap_or(m);
    if m.starts_with("unknown field") {
        // "unknown field `x`, expected one of `a`, `b`" -> keep it, it tells what to send.
        m.replace('`', "'")
    } else if m.starts_with("missing field") {
        "this field is required".to_string()
    } else {
        m.replace('`', "'")
    }
}

/// `value` as an identifier (1 to 64 letters, digits or `-_.:`), or 400 `invalid_request`
/// naming `field` (a query parameter, a path parameter or a JSON pointer).
pub fn check_ident(field: &str, value: &str) -> Result<String, ApiError> {
    crate::core::domain::Ident::parse(value)
        .map(|i| i.as_str().to_string())
        .map_err(|m| ApiError::invalid(field, m))
}

/// Client text kept for audit or shown to people: at most `max` characters (as JSON
/// Schema's `maxLength` counts them), and no control characters (no line breaks or escapes
/// smuggled into logs, previews and audit records).
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.is_empty() || value.chars().count() > max {
        return Err(ApiError::invalid(
            field,
            format!("must be 1 to {max} characters of text"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}
