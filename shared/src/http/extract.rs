//! Request parsing: the auth extractor, strict JSON bodies with JSON pointers, and strict
//! query parameters. Nothing here writes anything; a request refused here changed nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, Code, FieldError};
use crate::http::observe::CallerSlot;

/// Both tokens verified; the caller's identity and permissions.
pub struct Authed(pub Caller);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim);
        let operator = parts
            .headers
            .get("x-operator-token")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        let now_s = state.clock.now_ms().div_euclid(1000);
        let caller = state.auth.authenticate(bearer, operator, now_s).await?;
        if let Some(slot) = parts.extensions.get::<Arc<CallerSlot>>() {
            let _ = slot
                .who
                .set((caller.operator.sub.clone(), caller.service.sub.clone()));
        }
        Ok(Authed(caller))
    }
}

pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON body: `application/json`, at most 64 KiB, parsed into `T` with the JSON pointer
/// of the first field at fault.
pub struct JsonBody<T>(pub T);

fn too_large() -> ApiError {
    ApiError::new(
        Code::PayloadTooLarge,
        "The request body is larger than 64 KiB; send a smaller request.",
    )
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &AppState) -> Result<Self, ApiError> {
        let ct = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                "Send the request body as JSON with `Content-Type: application/json`.",
            ));
        }
        if let Some(len) = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
        {
            if len > MAX_BODY_BYTES {
                return Err(too_large());
            }
        }
        let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY_BYTES)
            .await
            .map_err(|_| too_large())?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses JSON text into `T`; errors name the JSON pointer of the field at fault.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            Code::InvalidRequest,
            format!(
                "The body is not valid JSON (line {}, column {}).",
                e.line(),
                e.column()
            ),
        )
        .with_field("", "malformed JSON")
    })?;
    from_value(value, "")
}

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
        let message = clean_serde_message(&inner);
        let field = if pointer.is_empty() {
            "/".to_string()
        } else {
            pointer
        };
        ApiError::new(
            Code::InvalidRequest,
            format!("The request is invalid at {field}: {message}."),
        )
        .with_details(vec![FieldError::new(field, message)])
    })
}

fn escape(s: &str) -> String {
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

/// Strict query parameters: each known parameter taken once, and anything left over is a
/// 400 so a misspelt filter never silently widens a result.
pub struct QueryParams {
    params: BTreeMap<String, String>,
}

impl QueryParams {
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|_| {
                ApiError::new(Code::InvalidRequest, "The query string is malformed.")
                    .with_field("?", "not application/x-www-form-urlencoded")
            })?;
        let mut params = BTreeMap::new();
        for (k, v) in pairs {
            if params.insert(k.clone(), v).is_some() {
                return Err(ApiError::invalid(
                    k,
                    "given more than once; send each query parameter at most once",
                ));
            }
        }
        Ok(QueryParams { params })
    }

    /// An optional non-empty string parameter.
    pub fn text(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) if v.is_empty() || v.len() > 128 => {
                Err(ApiError::invalid(name, "must be 1 to 128 characters"))
            }
            Some(v) => Ok(Some(v)),
        }
    }

    /// An optional parameter parsed with `FromStr`.
    pub fn parsed<T: std::str::FromStr<Err = String>>(
        &mut self,
        name: &str,
    ) -> Result<Option<T>, ApiError> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<T>()
                .map(Some)
                .map_err(|e| ApiError::invalid(name, e)),
        }
    }

    /// `limit`: default 50, 1..=200.
    pub fn limit(&mut self) -> Result<u32, ApiError> {
        use crate::pagination::{DEFAULT_LIMIT, MAX_LIMIT};
        match self.params.remove("limit") {
            None => Ok(DEFAULT_LIMIT),
            Some(v) => match v.parse::<u32>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
                _ => Err(ApiError::invalid(
                    "limit",
                    format!("must be a whole number from 1 to {MAX_LIMIT}"),
                )),
            },
        }
    }

    /// `limit` and `cursor`, the paging parameters of every listing.
    pub fn page(&mut self) -> Result<crate::protocol::reads::PageRequest, ApiError> {
        Ok(crate::protocol::reads::PageRequest {
            limit: self.limit()?,
            cursor: self.text("cursor")?,
        })
    }

    /// Refuses any parameter not taken.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.params.keys().next() {
            None => Ok(()),
            Some(k) => Err(ApiError::new(
                Code::InvalidRequest,
                format!("Unknown query parameter {k:?}; check its spelling."),
            )
            .with_details(
                self.params
                    .keys()
                    .map(|k| FieldError::new(k.clone(), "unknown query parameter"))
                    .collect(),
            )),
        }
    }
}
