//! The OpenAPI 3.1 document, made from the same registrations as the router.
//!
//! Each handler module builds an [`Api`]: one [`Api::route`] call per endpoint takes the
//! operation's description ([`Op`]: path, method, parameters, body and answer types, the
//! error codes it can return) and its handler, and adds both to the router and to the
//! document. So a route cannot exist without its documentation, and the document cannot
//! name a route that does not exist. Schemas come from the request and view types through
//! `schemars` (JSON Schema 2020-12, the dialect of OpenAPI 3.1), the same derivations the
//! MCP tools publish. `docs/openapi.json` is this document, committed; a test keeps the
//! two equal.

use axum::handler::Handler;
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Router;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::app::AppState;
use crate::core::error::Code;
use crate::doors::http::error::status_of;

/// Builds a schema (usually a `$ref` into `components/schemas`) with the document's
/// generator.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema of `T`, as a reference when `T` is named.
pub fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
        }
    }
    fn filter(self) -> MethodFilter {
        match self {
            Method::Get => MethodFilter::GET,
            Method::Post => MethodFilter::POST,
        }
    }
}

struct Param {
    name: &'static str,
    place: &'static str,
    required: bool,
    schema: SchemaFn,
    description: &'static str,
}

struct Answer {
    status: u16,
    description: &'static str,
    /// `None`: the answer has no body.
    schema: Option<SchemaFn>,
    example: Option<Value>,
    links: Option<Value>,
}

/// One operation of the document: what a route takes and answers.
pub struct Op {
    method: Method,
    path: String,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    description: &'static str,
    authed: bool,
    params: Vec<Param>,
    body: Option<(SchemaFn, Vec<(&'static str, Value)>)>,
    answers: Vec<Answer>,
    errors: Vec<Code>,
    never: Vec<Code>,
}

/// Errors every authenticated operation can answer: the two tokens, the caller's
/// permissions, an identity provider's key set or a store out of reach, a bug.
const AUTHED_ERRORS: &[Code] = &[
    Code::Unauthenticated,
    Code::OperatorUnauthenticated,
    Code::InsufficientScope,
    Code::Internal,
    Code::UpstreamUnavailable,
];

/// Errors of reading a JSON body (`request_timeout`: `airlock serve`'s body deadline).
const BODY_ERRORS: &[Code] = &[
    Code::InvalidRequest,
    Code::PayloadTooLarge,
    Code::UnsupportedMediaType,
    Code::RequestTimeout,
];

impl Op {
    fn new(method: Method, path: String, id: &'static str) -> Op {
        Op {
            method,
            path,
            id,
            tag: "",
            summary: "",
            description: "",
            authed: true,
            params: Vec::new(),
            body: None,
            answers: Vec::new(),
            // A query string is parsed strictly on every operation.
            errors: vec![Code::InvalidRequest],
            never: Vec::new(),
        }
    }

    /// A `GET` at `path` (the full path, base path included), named `id`.
    pub fn get(path: String, id: &'static str) -> Op {
        Op::new(Method::Get, path, id)
    }

    /// A `POST` at `path`, named `id`.
    pub fn post(path: String, id: &'static str) -> Op {
        Op::new(Method::Post, path, id)
    }

    pub fn tag(mut self, tag: &'static str) -> Op {
        self.tag = tag;
        self
    }

    pub fn summary(mut self, summary: &'static str, description: &'static str) -> Op {
        self.summary = summary;
        self.description = description;
        self
    }

    /// No tokens needed (`GET /health`).
    pub fn public(mut self) -> Op {
        self.authed = false;
        self.errors.clear();
        self
    }

    pub fn query(self, name: &'static str, schema: SchemaFn, description: &'static str) -> Op {
        self.param(name, "query", false, schema, description)
    }

    /// A query parameter the operation needs (absent: 400 `invalid_request`).
    pub fn required_query(
        self,
        name: &'static str,
        schema: SchemaFn,
        description: &'static str,
    ) -> Op {
        self.param(name, "query", true, schema, description)
    }

    fn param(
        mut self,
        name: &'static str,
        place: &'static str,
        required: bool,
        schema: SchemaFn,
        description: &'static str,
    ) -> Op {
        self.params.push(Param {
            name,
            place,
            required,
            schema,
            description,
        });
        self
    }

    /// `limit` and `cursor`, and the refusal of a cursor Airlock did not issue.
    pub fn paged(self) -> Op {
        self.query(
            "limit",
            |_| schemars::json_schema!({"type": "integer", "minimum": 1, "maximum": crate::core::pagination::MAX_LIMIT, "default": crate::core::pagination::DEFAULT_LIMIT}),
            "Rows per page, 1 to 200 (default 50).",
        )
        .query(
            "cursor",
            |_| schemars::json_schema!({"type": "string", "minLength": 1, "maxLength": crate::doors::http::extract::MAX_CURSOR_CHARS, "pattern": "^[A-Za-z0-9_.-]+$"}),
            "The `next_cursor` of the previous page, unchanged. A cursor Airlock did not issue for this query and caller is 400 `invalid_cursor`.",
        )
        .errors(&[Code::InvalidCursor])
    }

    pub fn path_param(self, name: &'static str, schema: SchemaFn, description: &'static str) -> Op {
        self.param(name, "path", true, schema, description)
    }

    pub fn header(self, name: &'static str, schema: SchemaFn, description: &'static str) -> Op {
        self.param(name, "header", false, schema, description)
    }

    /// A header the operation needs (absent or another value: 400 `invalid_request`).
    pub fn required_header(
        self,
        name: &'static str,
        schema: SchemaFn,
        description: &'static str,
    ) -> Op {
        self.param(name, "header", true, schema, description)
    }

    /// A JSON body of type `schema`, with named examples.
    pub fn body(mut self, schema: SchemaFn, examples: Vec<(&'static str, Value)>) -> Op {
        self.body = Some((schema, examples));
        self.errors(BODY_ERRORS)
    }

    /// A successful answer.
    pub fn answers(mut self, status: u16, description: &'static str, schema: SchemaFn) -> Op {
        self.answers.push(Answer {
            status,
            description,
            schema: Some(schema),
            example: None,
            links: None,
        });
        self
    }

    /// A successful answer without a body.
    pub fn answers_empty(mut self, status: u16, description: &'static str) -> Op {
        self.answers.push(Answer {
            status,
            description,
            schema: None,
            example: None,
            links: None,
        });
        self
    }

    /// An example of the last answer added.
    pub fn example(mut self, example: Value) -> Op {
        if let Some(a) = self.answers.last_mut() {
            a.example = Some(example);
        }
        self
    }

    /// OpenAPI links of the last answer added (what a client does next with it).
    pub fn links(mut self, links: Value) -> Op {
        if let Some(a) = self.answers.last_mut() {
            a.links = Some(links);
        }
        self
    }

    /// Error codes this operation can answer, besides those of its tokens and body.
    pub fn errors(mut self, codes: &[Code]) -> Op {
        for c in codes {
            if !self.errors.contains(c) {
                self.errors.push(*c);
            }
        }
        self
    }

    /// Codes of the usual sets (tokens, body) that this operation never answers.
    pub fn never(mut self, codes: &[Code]) -> Op {
        self.never.extend_from_slice(codes);
        self
    }

    fn operation(&self, g: &mut Generators) -> Value {
        let mut op = Map::new();
        op.insert("operationId".into(), json!(self.id));
        op.insert("tags".into(), json!([self.tag]));
        op.insert("summary".into(), json!(self.summary));
        op.insert("description".into(), json!(self.description));
        if !self.params.is_empty() {
            let params: Vec<Value> = self
                .params
                .iter()
                .map(|p| {
                    json!({
                        "name": p.name, "in": p.place, "required": p.required,
                        "description": p.description, "schema": (p.schema)(&mut g.input),
                    })
                })
                .collect();
            op.insert("parameters".into(), Value::Array(params));
        }
        if let Some((schema, examples)) = &self.body {
            let mut media = Map::new();
            media.insert("schema".into(), (schema)(&mut g.input).to_value());
            if !examples.is_empty() {
                let ex: Map<String, Value> = examples
                    .iter()
                    .map(|(name, v)| (name.to_string(), json!({ "value": v })))
                    .collect();
                media.insert("examples".into(), Value::Object(ex));
            }
            op.insert(
                "requestBody".into(),
                json!({"required": true, "content": {"application/json": media}}),
            );
        }
        let mut responses = Map::new();
        for a in &self.answers {
            let mut r = Map::new();
            r.insert("description".into(), json!(a.description));
            r.insert(
                "headers".into(),
                json!({"x-request-id": {"$ref": "#/components/headers/RequestId"}}),
            );
            if let Some(schema) = a.schema {
                let mut media = Map::new();
                media.insert("schema".into(), schema(&mut g.output).to_value());
                if let Some(e) = &a.example {
                    media.insert("example".into(), e.clone());
                }
                r.insert("content".into(), json!({"application/json": media}));
            }
            if let Some(l) = &a.links {
                r.insert("links".into(), l.clone());
            }
            responses.insert(a.status.to_string(), Value::Object(r));
        }
        let mut codes = self.errors.clone();
        if self.authed {
            codes.extend(AUTHED_ERRORS.iter().filter(|c| !self.errors.contains(c)));
        }
        codes.retain(|c| !self.never.contains(c));
        let mut by_status: std::collections::BTreeMap<u16, Vec<Code>> = Default::default();
        for c in codes {
            by_status.entry(status_of(c).as_u16()).or_default().push(c);
        }
        for (status, codes) in by_status {
            responses.insert(status.to_string(), error_response(status, &codes));
        }
        op.insert("responses".into(), Value::Object(responses));
        if self.authed {
            op.insert(
                "security".into(),
                json!([{"serviceBearer": [], "operatorToken": []}]),
            );
        } else {
            op.insert("security".into(), json!([]));
        }
        Value::Object(op)
    }
}

/// Requests are described as they are read, answers as they are written (an optional
/// field of an answer is there, `null`; a price is always text).
struct Generators {
    input: SchemaGenerator,
    output: SchemaGenerator,
}

impl Generators {
    fn new() -> Generators {
        let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        });
        Generators {
            input: settings.clone().for_deserialize().into_generator(),
            output: settings.for_serialize().into_generator(),
        }
    }

    /// Every named schema of both sides. A name both sides use must mean the same schema
    /// (enumerations, identifiers); otherwise the document is not built (a unit test builds
    /// it, so such a change never ships).
    fn definitions(mut self) -> Result<Map<String, Value>, String> {
        let mut all = self.input.take_definitions(true);
        for (name, schema) in self.output.take_definitions(true) {
            if all.get(&name).is_some_and(|seen| seen != &schema) {
                return Err(format!(
                    "schema {name} differs between requests and responses: give one side another name"
                ));
            }
            all.insert(name, schema);
        }
        Ok(all)
    }
}

/// The error answer of one status: the contract's error body with `code` limited to the
/// codes this operation answers with that status.
fn error_response(status: u16, codes: &[Code]) -> Value {
    let names: Vec<&str> = codes.iter().map(|c| c.as_str()).collect();
    let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    let mut headers = json!({"x-request-id": {"$ref": "#/components/headers/RequestId"}});
    match status {
        429 | 503 => {
            headers["Retry-After"] = json!({"$ref": "#/components/headers/RetryAfter"});
        }
        409 if codes.contains(&Code::IdempotencyKeyInFlight) => {
            headers["Retry-After"] = json!({"$ref": "#/components/headers/RetryAfterInFlight"});
        }
        _ => {}
    }
    json!({
        "description": format!("Error: {}. See the error table of docs/CONTRACT.md.", list.join(", ")),
        "headers": headers,
        "content": {"application/json": {"schema": {
            "allOf": [{"$ref": "#/components/schemas/Error"}],
            "properties": {"error": {"properties": {"code": {"enum": names}}}}
        }}}
    })
}

/// A router and the operations it serves, built together.
pub struct Api {
    router: Router<AppState>,
    ops: Vec<Op>,
}

impl Default for Api {
    fn default() -> Self {
        Api::new()
    }
}

impl Api {
    pub fn new() -> Api {
        Api {
            router: Router::new(),
            ops: Vec::new(),
        }
    }

    /// Serves `op` with `handler`: on the router and in the document.
    pub fn route<H, T>(self, op: Op, handler: H) -> Api
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let filter = op.method.filter();
        self.route_with(op, on(filter, handler))
    }

    /// Serves `op` with a method router of its own (the MCP endpoint answers GET and
    /// DELETE with 405 itself).
    pub fn route_with(mut self, op: Op, methods: MethodRouter<AppState>) -> Api {
        self.router = self.router.route(&op.path, methods);
        self.ops.push(op);
        self
    }

    /// Routes that are not part of the API document (the approval pages, for browsers).
    pub fn pages(mut self, router: Router<AppState>) -> Api {
        self.router = self.router.merge(router);
        self
    }

    pub fn merge(mut self, other: Api) -> Api {
        self.router = self.router.merge(other.router);
        self.ops.extend(other.ops);
        self
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }

    /// The OpenAPI 3.1 document of these operations.
    pub fn document(&self) -> Result<Value, String> {
        let mut g = Generators::new();
        let error = g.output.subschema_for::<ErrorBodySchema>();
        debug_assert!(error.get("$ref").is_some());
        let mut paths = Map::new();
        let mut tags: Vec<&str> = Vec::new();
        for op in &self.ops {
            let entry = paths
                .entry(op.path.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            entry[op.method.name()] = op.operation(&mut g);
            if !tags.contains(&op.tag) {
                tags.push(op.tag);
            }
        }
        let schemas = g.definitions()?;
        Ok(json!({
            "openapi": "3.1.0",
            "info": {
                "title": "Airlock API",
                "version": env!("CARGO_PKG_VERSION"),
                "summary": "Read brokerage data, plan and execute confirmed actions.",
                "description": "The HTTP API a Mastra agent calls. Every operation under /api/internal/v1/mastra needs two tokens: the service's bearer token and the operator's X-Operator-Token. Prose reference: docs/CONTRACT.md; what may change within v1: its Versioning section.",
                "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}
            },
            "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
            "tags": tags.iter().map(|t| json!({"name": t})).collect::<Vec<_>>(),
            "paths": paths,
            "components": {
                "schemas": schemas,
                "securitySchemes": {
                    "serviceBearer": {
                        "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                        "description": "The calling service's token (Mastra): ES256 or RS256 JWT from a configured issuer, with the service's scopes."
                    },
                    "operatorToken": {
                        "type": "apiKey", "in": "header", "name": "X-Operator-Token",
                        "description": "The operator's token: a JWT naming the person the agent acts for (their sub, roles and desks)."
                    }
                },
                "headers": {
                    "RequestId": {
                        "description": "Airlock's id of this request, in every log line and audit record of it.",
                        "required": true,
                        "schema": {"type": "string", "pattern": "^req_[0-9a-z]+$"}
                    },
                    "RetryAfter": {
                        "description": "Seconds to wait before retrying the same request.",
                        "required": true,
                        "schema": {"type": "string", "pattern": "^[0-9]+$"}
                    },
                    "RetryAfterInFlight": {
                        "description": "With `idempotency_key_in_flight`: seconds to wait before retrying with the same key.",
                        "required": false,
                        "schema": {"type": "string", "pattern": "^[0-9]+$"}
                    }
                }
            }
        }))
    }
}

/// The contract's error body (`http::error::ErrorBody`), as a schema.
#[allow(dead_code)]
#[derive(JsonSchema)]
#[schemars(rename = "Error", deny_unknown_fields)]
struct ErrorBodySchema {
    error: ErrorDetailSchema,
    /// Airlock's id of the request (also the `x-request-id` header).
    #[schemars(regex(pattern = "^req_[0-9a-z]+$"))]
    request_id: String,
    /// `rejected` on a rejection of `POST /actions/execute`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("const" = "rejected"))]
    status: Option<String>,
    /// The action an in-flight idempotency key is working on (409
    /// `idempotency_key_in_flight`).
    #[serde(skip_serializing_if = "Option::is_none")]
    action_id: Option<String>,
    /// Where the operator approves the plan (409 `approval_required`).
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<crate::core::usecases::plan::ApprovalInfo>,
}

#[allow(dead_code)]
#[derive(JsonSchema)]
#[schemars(rename = "ErrorDetail", deny_unknown_fields)]
struct ErrorDetailSchema {
    /// Stable, snake_case: branch on it.
    code: ErrorCodeSchema,
    /// One sentence a person (or an LLM relaying to one) can act on.
    message: String,
    /// The fields at fault, when there is something to point at.
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Vec<FieldErrorSchema>>,
}

#[allow(dead_code)]
#[derive(JsonSchema)]
#[schemars(rename = "FieldError", deny_unknown_fields)]
struct FieldErrorSchema {
    /// A JSON pointer into the body, a query, path or header parameter name, or
    /// `risk_checks/<check>`.
    field: String,
    message: String,
}

/// Every error code of the contract.
struct ErrorCodeSchema;

impl JsonSchema for ErrorCodeSchema {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        schemars::json_schema!({"type": "string", "enum": codes})
    }
}
