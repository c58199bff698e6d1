//! Request parsing: the auth extractor, strict JSON bodies with JSON pointers, and strict
//! query parameters. Nothing here writes anything; a request refused here changed nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::app::AppState;
use crate::core::auth::Caller;
use crate::core::error::{ApiError, Code, FieldError};
use crate::core::parse::escape;
pub use crate::core::parse::from_value;
pub use crate::core::parse::{check_ident, check_text};
use crate::doors::http::observe::CallerSlot;

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

/// 413 `payload_too_large`: a body over [`MAX_BODY_BYTES`].
pub fn too_large() -> ApiError {
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
/// The text is checked first (see [`check_json_text`]): a key given twice anywhere, or an
/// over-long string, is refused instead of silently keeping the last value.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let malformed = |e: serde_json::Error| {
        ApiError::new(
            Code::InvalidRequest,
            format!(
                "The body is not valid JSON (line {}, column {}).",
                e.line(),
                e.column()
            ),
        )
        .with_field("/", "malformed JSON")
    };
    check_json_text(bytes).map_err(|f| match f {
        TextFault::Syntax(e) => malformed(e),
        TextFault::Field(e) => e,
    })?;
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(malformed)?;
    from_value(value, "")
}

/// The longest string value a body may hold anywhere, in characters (a confirmation token
/// is the longest legitimate one, well under this). Characters, not bytes, as JSON
/// Schema's `maxLength` counts them.
pub const MAX_JSON_STRING_CHARS: usize = 4096;
/// The longest object key a body may hold anywhere, in characters.
pub const MAX_JSON_KEY_CHARS: usize = 128;

/// What the text check finds wrong with JSON text.
pub enum TextFault {
    /// Not JSON at all.
    Syntax(serde_json::Error),
    /// JSON, with a field the contract refuses (its pointer in the error's details).
    Field(ApiError),
}

/// Walks JSON text once, without building it, and refuses what the typed parse cannot
/// see: an object key given twice (serde keeps the last one, so `{"quantity":1,
/// "quantity":9}` would plan 9), a key longer than [`MAX_JSON_KEY_CHARS`] and a string
/// longer than [`MAX_JSON_STRING_CHARS`]. The error names the JSON pointer at fault. Every
/// door reads JSON through this check: REST bodies ([`parse_json`]) and MCP messages, tool
/// arguments included ([`json_text_faults`]).
pub fn check_json_text(bytes: &[u8]) -> Result<(), TextFault> {
    match walk_json_text(bytes, false) {
        (Ok(()), _) => Ok(()),
        (Err(_), mut faults) if !faults.is_empty() => Err(TextFault::Field(faults.remove(0))),
        (Err(e), _) => Err(TextFault::Syntax(e)),
    }
}

/// Every fault [`check_json_text`] refuses, in the text's order (for a message whose parts
/// are answered apart: an MCP message's envelope and its tool arguments). `Err`: the text
/// is not JSON.
pub fn json_text_faults(bytes: &[u8]) -> Result<Vec<ApiError>, serde_json::Error> {
    match walk_json_text(bytes, true) {
        (Ok(()), faults) => Ok(faults),
        (Err(e), _) => Err(e),
    }
}

/// Walks the text; with `all`, on past each fault (only malformed text stops it).
fn walk_json_text(bytes: &[u8], all: bool) -> (Result<(), serde_json::Error>, Vec<ApiError>) {
    use serde::de::DeserializeSeed;
    let faults = std::cell::RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let walked = Walk {
        path: String::new(),
        faults: &faults,
        all,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    (walked, faults.into_inner())
}

/// One JSON value at `path` (a JSON pointer); records the faults it finds (the first only,
/// unless `all`).
struct Walk<'a> {
    path: String,
    faults: &'a std::cell::RefCell<Vec<ApiError>>,
    all: bool,
}

impl Walk<'_> {
    /// Records a fault; `Err` stops the walk (unless it walks on past faults).
    fn fail<E: serde::de::Error>(&self, pointer: String, message: &str) -> Result<(), E> {
        self.faults
            .borrow_mut()
            .push(ApiError::invalid_at(pointer, message));
        if self.all {
            Ok(())
        } else {
            Err(E::custom(message))
        }
    }

    fn string<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        if s.chars().count() > MAX_JSON_STRING_CHARS {
            let m = format!("text longer than {MAX_JSON_STRING_CHARS} characters");
            return self.fail(self.path.clone(), &m);
        }
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<(), E> {
        self.string(s)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while seq
            .next_element_seed(Walk {
                path: format!("{}/{i}", self.path),
                faults: self.faults,
                all: self.all,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let pointer = format!("{}/{}", self.path, escape(&key));
            if key.chars().count() > MAX_JSON_KEY_CHARS {
                let m = format!("key longer than {MAX_JSON_KEY_CHARS} characters");
                self.fail::<A::Error>(pointer.clone(), &m)?;
            } else if !seen.insert(key) {
                self.fail::<A::Error>(
                    pointer.clone(),
                    "this key is given more than once; send each key once",
                )?;
            }
            map.next_value_seed(Walk {
                path: pointer,
                faults: self.faults,
                all: self.all,
            })?;
        }
        Ok(())
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

    /// An optional non-empty text parameter: 1 to 128 bytes, no control characters.
    pub fn text(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) => check_text(name, &v, 128).map(|()| Some(v)),
        }
    }

    /// An optional identifier parameter (`account_id`): an [`Ident`](crate::core::domain::Ident),
    /// so nothing malformed or over-long ever reaches a store key.
    pub fn ident(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.params.remove(name) {
            None => Ok(None),
            Some(v) => check_ident(name, &v).map(Some),
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
        use crate::core::pagination::{DEFAULT_LIMIT, MAX_LIMIT};
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
    pub fn page(&mut self) -> Result<crate::core::usecases::reads::PageRequest, ApiError> {
        let limit = self.limit()?;
        let cursor = match self.params.remove("cursor") {
            None => None,
            Some(c) if is_cursor_text(&c) => Some(c),
            Some(_) => {
                return Err(ApiError::new(
                    Code::InvalidCursor,
                    "The cursor is not one Airlock issued; pass next_cursor back unchanged.",
                )
                .with_field("cursor", "not a cursor from a previous page"))
            }
        };
        Ok(crate::core::usecases::reads::PageRequest { limit, cursor })
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

/// The longest cursor accepted, in characters (the cursor codec's own bound).
pub const MAX_CURSOR_CHARS: usize = 1024;

/// What a cursor Airlock issued looks like: base64url text and one `.`, bounded.
fn is_cursor_text(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= MAX_CURSOR_CHARS
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The one path parameter of a route (`/actions/{action_id}`) as an identifier.
///
/// Unlike axum's `Path`, a refusal is the contract's JSON error: a segment that does not
/// percent-decode to UTF-8 (`/actions/%FF`), or that is not an identifier (too long,
/// other characters), is 400 `invalid_request` naming the parameter, before any store is
/// asked. An id that is well formed but unknown stays the endpoint's 404.
/// The query string, parsed; a handler takes what it knows and calls
/// [`QueryParams::finish`], which refuses the rest.
pub struct Query(pub QueryParams);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        QueryParams::parse(parts.uri.query()).map(Query)
    }
}

pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        // The route's template (`.../actions/{action_id}`) against the raw path, segment by
        // segment: the parameter's name and its still-encoded text, decoded here once.
        let template = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map(|m| m.as_str().to_string())
            .ok_or_else(|| ApiError::internal("PathId outside a matched route"))?;
        let path = parts.uri.path();
        let found = template
            .split('/')
            .zip(path.split('/'))
            .find_map(|(t, raw)| {
                t.strip_prefix('{')
                    .and_then(|t| t.strip_suffix('}'))
                    .map(|name| (name, raw))
            });
        let Some((name, raw)) = found else {
            return Err(ApiError::internal(format!(
                "PathId: no parameter in the route {template}"
            )));
        };
        let decoded = percent_decode(raw)
            .ok_or_else(|| ApiError::invalid(name, "is not valid percent-encoded UTF-8"))?;
        check_ident(name, &decoded).map(PathId)
    }
}

/// Percent-decodes a path segment; `None` if an escape is malformed or the result is not
/// UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(body: &str) -> String {
        match parse_json::<serde_json::Value>(body.as_bytes()) {
            Ok(_) => panic!("{body} was accepted"),
            Err(e) => {
                assert_eq!(e.code, Code::InvalidRequest, "{body}");
                e.details[0].field.clone()
            }
        }
    }

    #[test]
    fn duplicate_keys_are_refused_anywhere_with_their_pointer() {
        assert_eq!(field_of(r#"{"quantity":1,"quantity":9}"#), "/quantity");
        assert_eq!(
            field_of(r#"{"payload":{"side":"buy","quantity":1,"quantity":9}}"#),
            "/payload/quantity"
        );
        assert_eq!(
            field_of(r#"{"a":[{"x":1},{"y":{"k/~":1,"k/~":2}}]}"#),
            "/a/1/y/k~1~0"
        );
        // Escapes that decode to the same key are the same key.
        assert_eq!(field_of(r#"{"ab":1,"\u0061b":2}"#), "/ab");
        // The same key in sibling objects is fine.
        let ok: serde_json::Value =
            parse_json(br#"{"a":{"k":1},"b":{"k":2},"c":[{"k":1},{"k":2}]}"#).unwrap();
        assert_eq!(ok["c"][1]["k"], 2);
    }

    #[test]
    fn over_long_strings_and_keys_are_refused_with_their_pointer() {
        let long = "x".repeat(MAX_JSON_STRING_CHARS + 1);
        assert_eq!(field_of(&format!(r#"{{"a":[1,"{long}"]}}"#)), "/a/1");
        let key = "k".repeat(MAX_JSON_KEY_CHARS + 1);
        assert_eq!(
            field_of(&format!(r#"{{"a":{{"{key}":1}}}}"#)),
            format!("/a/{key}")
        );
        let ok = "x".repeat(MAX_JSON_STRING_CHARS);
        assert!(parse_json::<serde_json::Value>(format!(r#"{{"a":"{ok}"}}"#).as_bytes()).is_ok());
    }

    #[test]
    fn every_fault_is_found_when_asked_for_all() {
        let long = "x".repeat(MAX_JSON_STRING_CHARS + 1);
        let text =
            format!(r#"{{"a":{{"q":1,"q":7}},"b":"{long}","c":[{{"k":1,"k":2,"k":3}}],"a":0}}"#);
        let fields: Vec<String> = json_text_faults(text.as_bytes())
            .unwrap()
            .into_iter()
            .map(|e| e.details[0].field.clone())
            .collect();
        assert_eq!(fields, ["/a/q", "/b", "/c/0/k", "/c/0/k", "/a"]);
        assert!(json_text_faults(br#"{"a":1,"b":{"a":1}}"#)
            .unwrap()
            .is_empty());
        assert!(json_text_faults(b"{\"a\":").is_err());
        // The first-fault check agrees with the first of them.
        match check_json_text(text.as_bytes()) {
            Err(TextFault::Field(e)) => assert_eq!(e.details[0].field, "/a/q"),
            _ => panic!("a duplicate key was accepted"),
        }
    }

    #[test]
    fn malformed_json_is_still_reported_as_such() {
        for bad in ["{\"a\":", "[1,]", "{\"a\":1} x", "\"\\ud800\""] {
            let e = parse_json::<serde_json::Value>(bad.as_bytes()).unwrap_err();
            assert_eq!(e.details[0].field, "/", "{bad}");
            assert!(e.message.contains("not valid JSON"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn path_segments_decode_strictly() {
        assert_eq!(percent_decode("act_1").as_deref(), Some("act_1"));
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("%FF"), None);
        assert_eq!(percent_decode("%F"), None);
        assert_eq!(percent_decode("%zz"), None);
    }

    #[test]
    fn query_ids_and_cursors_are_bounded() {
        let mut q = QueryParams::parse(Some("account_id=ACC-1")).unwrap();
        assert_eq!(q.ident("account_id").unwrap().as_deref(), Some("ACC-1"));
        for bad in ["a%20b", "", "%FF"] {
            let mut q = QueryParams::parse(Some(&format!("account_id={bad}"))).unwrap();
            let e = q.ident("account_id").unwrap_err();
            assert_eq!(e.details[0].field, "account_id", "{bad}");
        }
        let long = "a".repeat(65);
        let mut q = QueryParams::parse(Some(&format!("account_id={long}"))).unwrap();
        assert!(q.ident("account_id").is_err());
        let long = "a".repeat(MAX_CURSOR_CHARS + 1);
        let mut q = QueryParams::parse(Some(&format!("cursor={long}"))).unwrap();
        assert_eq!(q.page().err().map(|e| e.code), Some(Code::InvalidCursor));
        let mut q = QueryParams::parse(Some("cursor=e30%0A.AAAA")).unwrap();
        assert_eq!(q.page().err().map(|e| e.code), Some(Code::InvalidCursor));
    }
}
