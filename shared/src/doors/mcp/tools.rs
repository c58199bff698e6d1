//! The agent's tools, for every tool front door (the MCP endpoint today): each tool is a
//! name, a permission, safety hints, input and output JSON Schemas generated from the same
//! Rust types as the REST API, and a call into the same use cases as the REST handlers
//! (`Reads`, `Planner`, `Executor`). Nothing here is a second implementation: a tool parses
//! its arguments into the REST request types and answers with the REST views.

use std::sync::{Arc, OnceLock};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::core::auth::{Caller, Permission};
use crate::core::domain::IdempotencyKey;
use crate::core::error::{ApiError, Code};
use crate::core::parse::from_value;
use crate::core::usecases::actions::{self, Action};
use crate::core::usecases::execute::{ExecuteOutcome, ExecuteRequest, Executor, RequestFacts};
use crate::core::usecases::plan::{PlanRequest, PlanResponse, Planner};
use crate::core::usecases::reads::{PageRequest, Reads};
use crate::core::usecases::views::{ActionView, ListingView, Viewed};
use crate::core::usecases::ChatContext;
use crate::doors::http::routes::{accounts, jobs, orders, positions, ListingTool};

/// One tool as a client sees it.
#[derive(Debug, Clone)]
pub struct ToolDef {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    /// The caller's effective permission that lists and allows it.
    pub permission: Permission,
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    /// JSON Schema 2020-12 of the arguments (an object).
    pub input_schema: Value,
    /// JSON Schema 2020-12 of `structuredContent` (an object).
    pub output_schema: Value,
}

/// Who is calling and from where, for audit records.
#[derive(Debug, Clone, Default)]
pub struct ToolFacts {
    pub request_id: String,
    pub chat_session_id: Option<String>,
    pub tool_call_id: Option<String>,
    /// On Lambda, when the invocation must have answered (milliseconds since the epoch):
    /// `get_action`'s wait ends in time for its answer.
    pub deadline_ms: Option<u64>,
    /// The operation timeout of the backend's calls, for what must fit after a wait.
    pub operation_timeout_ms: u64,
}

/// What a tool call amounts to.
#[derive(Debug, Clone)]
pub enum ToolOutcome {
    /// The answer: the REST view as structured content, and one short line of text.
    Done { structured: Value, text: String },
    /// The plan waits for its operator's approval on the approval page: the client should
    /// open `url` for the user, then call the same tool again.
    NeedsApproval {
        plan_id: String,
        url: String,
        expires_at: String,
        message: String,
    },
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AccountArgs {
    /// The account.
    account_id: crate::core::domain::Ident,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AllocationArgs {
    /// One account; without it, every account the operator may see.
    account_id: Option<crate::core::domain::Ident>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ActionArgs {
    action_id: crate::core::domain::Ident,
    /// Seconds to wait for the status to change, 0 to 20 (default 0).
    #[schemars(range(min = 0, max = 20))]
    wait: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecuteArgs {
    /// The plan to execute, from a plan tool.
    plan_id: crate::core::domain::Ident,
    /// Optional: without one, a key derived from the plan and the caller is used, so a
    /// retried call is a `duplicate`, never a second order.
    idempotency_key: Option<IdempotencyKey>,
    /// Only for plans confirmed with a token (cancels and syncs): the plan's
    /// `confirmation_token`. Orders are approved by the operator on the approval page.
    confirmation_token: Option<String>,
}

fn schema_of<T: JsonSchema>() -> Value {
    tool_schema(schemars::schema_for!(T))
}

/// A root schema as a tool publishes it.
fn tool_schema(root: schemars::Schema) -> Value {
    let mut v = serde_json::to_value(root).unwrap_or_else(|_| json!({}));
    // 2020-12 is the default dialect of MCP schemas: no `$schema` needed.
    if let Some(m) = v.as_object_mut() {
        m.remove("$schema");
        m.remove("title");
    }
    v
}

/// `{ "<name>": [<item>], "next_cursor": string|null }`.
fn listing_schema<T: JsonSchema>(name: &str) -> Value {
    let mut item = schema_of::<T>();
    let defs = item
        .as_object_mut()
        .and_then(|m| m.remove("$defs"))
        .unwrap_or_else(|| json!({}));
    json!({
        "type": "object",
        "properties": {
            name: { "type": "array", "items": item },
            "next_cursor": { "type": ["string", "null"] }
        },
        "required": [name, "next_cursor"],
        "$defs": defs
    })
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "code": { "type": "string" },
                    "message": { "type": "string" },
                    "details": { "type": "array", "items": { "type": "object" } }
                },
                "required": ["code", "message"]
            }
        },
        "required": ["error"]
    })
}

/// The output schema of a tool: its answer, or the contract's error body (`isError`). The
/// answer's definitions move to the root, where its `#/$defs/...` references point.
fn output(mut answer: Value) -> Value {
    let defs = answer
        .as_object_mut()
        .and_then(|m| m.remove("$defs"))
        .unwrap_or_else(|| json!({}));
    json!({ "anyOf": [answer, error_schema()], "type": "object", "$defs": defs })
}

const READ: (bool, bool, bool) = (true, false, true);

/// A tool call's future.
type Call<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<ToolOutcome, ApiError>> + Send + 'a>>;

/// A listing tool: described with its REST route (`listing_route!`), read by the same use case.
struct Listing {
    name: &'static str,
    def: fn() -> ToolDef,
    call: for<'a> fn(&'a Tools, &'a Caller, Value) -> Call<'a>,
}

/// The listing tools, in the catalog's order.
const LISTINGS: [Listing; 4] = [
    listing::<accounts::Tool>(),
    listing::<positions::Tool>(),
    listing::<orders::Tool>(),
    listing::<jobs::Tool>(),
];

const fn listing<L: ListingTool>() -> Listing
where
    for<'a> &'a L::Row: Into<<L::Row as Viewed<'a>>::View>,
    <L::Row as Viewed<'static>>::View: JsonSchema,
{
    Listing {
        name: L::TOOL.0,
        def: listing_def::<L>,
        call: listing_call::<L>,
    }
}

fn listing_def<L: ListingTool>() -> ToolDef
where
    <L::Row as Viewed<'static>>::View: JsonSchema,
{
    let (name, title, description) = L::TOOL;
    let (read_only, destructive, idempotent) = READ;
    ToolDef {
        name,
        title,
        description,
        permission: Permission::Read,
        read_only,
        destructive,
        idempotent,
        input_schema: schema_of::<L::Args>(),
        output_schema: output(listing_schema::<<L::Row as Viewed<'static>>::View>(L::NAME)),
    }
}

fn listing_call<'a, L: ListingTool>(tools: &'a Tools, caller: &'a Caller, args: Value) -> Call<'a>
where
    for<'b> &'b L::Row: Into<<L::Row as Viewed<'b>>::View>,
{
    Box::pin(async move {
        let a: L::Args = from_value(args, "")?;
        let (limit, cursor) = L::page(&a);
        let l = L::read(&tools.reads, caller, a, &page(limit, cursor)?).await?;
        let text = listing_text(l.rows.len(), L::NAME, l.next_cursor.is_some());
        done(
            &ListingView {
                name: L::NAME,
                listing: &l,
            },
            text,
        )
    })
}

/// Every tool, in a stable order.
pub fn catalog() -> &'static [ToolDef] {
    static TOOLS: OnceLock<Vec<ToolDef>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let tool = |name, title, description, permission, (read_only, destructive, idempotent): (bool, bool, bool), input_schema, output_schema| ToolDef {
            name,
            title,
            description,
            permission,
            read_only,
            destructive,
            idempotent,
            input_schema,
            output_schema: output(output_schema),
        };
        let plan_out = schema_of::<PlanResponse>();
        let listings = LISTINGS.iter().map(|l| (l.def)());
        let plans: Vec<ToolDef> = actions::all()
            .map(|a| {
                let t = a.plan_tool();
                tool(t.name, t.title, t.description, Permission::Plan, READ, tool_schema(a.root_schema()), plan_out.clone())
            })
            .collect();
        let reads_and_plans = listings.chain([
            tool("get_action", "Get an action's status", "The status of an executed action (queued, processing, succeeded, failed). Pass wait (seconds, up to 20) to get the answer as soon as the status changes.", Permission::Read, READ, schema_of::<ActionArgs>(), schema_of::<ActionView<'static>>()),
            tool("portfolio_analysis", "Analyse an account's portfolio", "What an account's CL positions are worth and risk: per position the notional (contracts x 1,000 barrels x reference price, USD) and unrealized P&L; gross and net notional, net contracts; the day's P&L on the CME trading day (realized, unrealized, total), the daily loss limit, what is left of it and whether the account is close-only. Decimal strings.", Permission::Read, READ, schema_of::<AccountArgs>(), schema_of::<crate::core::usecases::portfolio::PortfolioView>()),
            tool("allocation_breakdown", "Break down the allocation", "Where the gross notional sits: by contract month, by side and by desk, as percentages that sum to 100. Without account_id, every account the operator may see.", Permission::Read, READ, schema_of::<AllocationArgs>(), schema_of::<crate::core::usecases::portfolio::AllocationView>()),
            tool("risk_flags", "An account's risk flags", "Deterministic flags with their figures: concentration in a contract month (warn), a position near the policy limit (warn), a position in the close-only window or near its last trading day, where CL goes to physical delivery (fail); and the long/short calendar exposure. Check them before answering about risk.", Permission::Read, READ, schema_of::<AccountArgs>(), schema_of::<crate::core::usecases::portfolio::RiskFlagsView>()),
        ]);
        let execute = [
            tool("execute_plan", "Execute a plan", "Queue a planned action for the workers, after the operator confirmed it (orders: approved on the approval page). Safe to retry: the same plan and caller never execute twice. Report progress with get_action.", Permission::Execute, (false, true, true), schema_of::<ExecuteArgs>(), schema_of::<crate::core::usecases::execute::Accepted>()),
        ];
        reads_and_plans.chain(plans).chain(execute).collect()
    })
}

/// The tools this caller may list and call: the caller's effective permissions decide.
pub fn visible(caller: &Caller) -> impl Iterator<Item = &'static ToolDef> + '_ {
    catalog()
        .iter()
        .filter(|t| caller.permissions.contains(&t.permission))
}

/// The idempotency key of an `execute_plan` call that names none: one per plan and caller,
/// so a retried tool call replays the first decision.
pub fn derived_key(caller: &Caller, plan_id: &str) -> String {
    let h = crate::core::digest::sha256_hex(
        format!(
            "{}\u{0}{}\u{0}{plan_id}",
            caller.service.sub, caller.operator.sub
        )
        .as_bytes(),
    );
    format!("mcp:{plan_id}:{}", &h[..16])
}

/// The tool use cases, built once per process (`app.rs`).
#[derive(Clone)]
pub struct Tools {
    pub reads: Arc<Reads>,
    pub portfolio: Arc<crate::core::usecases::portfolio::Portfolios>,
    pub plan: Arc<Planner>,
    pub execute: Arc<Executor>,
    /// Read while a call waits for an operator's approval (no audit record per look).
    pub plans: Arc<dyn crate::core::ports::PlanStore>,
    pub clock: crate::core::clock::SharedClock,
    /// Which calls may wait for an approval: one per plan, a few per operator.
    pub holds: crate::core::usecases::limits::ApprovalHolds,
    /// The longest a call waits for an approval (`AIRLOCK_APPROVAL_HOLD_MS`).
    pub approval_hold: std::time::Duration,
    /// The firm-wide pace of `execute_plan` calls (`AIRLOCK_MCP_EXECUTE_RATE_PER_SECOND`
    /// and `AIRLOCK_MCP_EXECUTE_BURST`): what API Gateway's execute throttle is to
    /// `POST /actions/execute`, which it cannot be to one tool of the MCP route.
    pub execute_pace: Option<crate::core::usecases::limits::Pace>,
}

impl Tools {
    /// The agent's tools over the app's use cases.
    pub fn of(app: &crate::app::UseCases) -> Tools {
        Tools {
            reads: app.reads.clone(),
            portfolio: app.portfolio.clone(),
            plan: app.plan.clone(),
            execute: app.execute.clone(),
            plans: app.ports.plans.clone(),
            clock: app.clock.clone(),
            holds: crate::core::usecases::limits::ApprovalHolds {
                store: app.ports.limits.clone(),
                per_operator: app.config.approval_holds_per_operator,
                clock: app.clock.clone(),
            },
            approval_hold: std::time::Duration::from_millis(app.config.approval_hold_ms),
            execute_pace: app.config.mcp_execute_rate_per_second.map(|per_second| {
                crate::core::usecases::limits::Pace {
                    store: app.ports.limits.clone(),
                    id: crate::core::usecases::limits::MCP_EXECUTE_PACE_ID,
                    per_second,
                    burst: app.config.mcp_execute_burst,
                    clock: app.clock.clone(),
                    what: "MCP execute_plan",
                }
            }),
        }
    }
}

fn page(limit: Option<u32>, cursor: Option<String>) -> Result<PageRequest, ApiError> {
    let limit = limit.unwrap_or(crate::core::pagination::DEFAULT_LIMIT);
    if !(1..=crate::core::pagination::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("/limit", "must be 1 to 200"));
    }
    Ok(PageRequest { limit, cursor })
}

fn done<T: serde::Serialize>(v: &T, text: String) -> Result<ToolOutcome, ApiError> {
    Ok(ToolOutcome::Done {
        structured: serde_json::to_value(v)
            .map_err(|e| ApiError::internal(format!("encoding a tool answer: {e}")))?,
        text,
    })
}

fn listing_text(n: usize, what: &str, more: bool) -> String {
    format!(
        "{n} {what}{}",
        if more { "; more with next_cursor" } else { "" }
    )
}

impl Tools {
    /// Whether `args` name a plan (`plan_id`) that still waits for its operator's approval:
    /// a cheap read to poll while holding a call, instead of an execute (and its audit
    /// record) per look.
    pub async fn awaiting_approval(&self, args: &Value) -> Result<bool, ApiError> {
        let Some(id) = args.get("plan_id").and_then(Value::as_str) else {
            return Ok(false);
        };
        let now = self.clock.now_ms();
        Ok(self
            .plans
            .get_plan(id)
            .await?
            .is_some_and(|p| p.awaits_approval(now)))
    }

    /// Admits one `execute_plan` call under the firm-wide pace, before anything else is
    /// read or written for it: a call over it is 429 `rate_limited` with `Retry-After`, as
    /// API Gateway's throttle answers `POST /actions/execute`, and counts for nothing else.
    pub async fn pace_execute(&self) -> Result<(), ApiError> {
        match &self.execute_pace {
            Some(p) => p.admit().await,
            None => Ok(()),
        }
    }

    /// Holds an `execute_plan` call (`args`) while its plan waits for the operator's
    /// approval, looking at the plan (a read, no audit record) until it is decided or
    /// `until`. `false`: not held, because another call holds this plan, the operator's
    /// holds are all taken ([`crate::core::usecases::limits::ApprovalHolds`]) or no time is left;
    /// the caller answers at once. `true`: held; the caller executes once more.
    pub async fn hold_for_approval(
        &self,
        caller: &Caller,
        args: &Value,
        until: tokio::time::Instant,
    ) -> Result<bool, ApiError> {
        let Some(plan_id) = args.get("plan_id").and_then(Value::as_str) else {
            return Ok(false);
        };
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ends = self.clock.now_ms() + left.as_millis().min(i64::MAX as u128) as i64;
        let Some(held) = self.holds.take(&caller.operator.sub, plan_id, ends).await? else {
            return Ok(false);
        };
        let mut decided = false;
        while tokio::time::Instant::now() < until {
            if !self.awaiting_approval(args).await.unwrap_or(false) {
                decided = true;
                break;
            }
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(left.min(std::time::Duration::from_millis(500))).await;
        }
        // Decided before its time: the operator's other plans may be held now. (A hold that
        // ran out ends by itself.)
        if decided {
            if let Err(e) = self.holds.release(&held).await {
                tracing::warn!(
                    code = e.code.as_str(),
                    cause = e.cause.as_deref().unwrap_or(""),
                    "approval hold not released; it ends at its time"
                );
            }
        }
        Ok(true)
    }

    /// Runs a tool the caller may see (an unknown or hidden one is the caller's to refuse
    /// before this: see [`visible`]). Bad arguments and refusals are errors with the
    /// contract's codes, to be answered as tool errors.
    pub async fn call(
        &self,
        caller: &Caller,
        tool: &ToolDef,
        args: Value,
        facts: &ToolFacts,
    ) -> Result<ToolOutcome, ApiError> {
        let result = self.run(caller, tool, args, facts).await;
        // `airlock_mcp_tool_calls_total{tool, outcome}`: the agent's tool error rate.
        let outcome = match &result {
            Ok(ToolOutcome::Done { .. }) => "ok",
            Ok(ToolOutcome::NeedsApproval { .. }) => "approval_required",
            Err(_) => "error",
        };
        metrics::counter!(crate::metrics::MCP_TOOL_CALLS, "tool" => tool.name, "outcome" => outcome)
            .increment(1);
        result
    }

    async fn run(
        &self,
        caller: &Caller,
        tool: &ToolDef,
        args: Value,
        facts: &ToolFacts,
    ) -> Result<ToolOutcome, ApiError> {
        caller.require(tool.permission)?;
        let args = if args.is_null() { json!({}) } else { args };
        if let Some(l) = LISTINGS.iter().find(|l| l.name == tool.name) {
            return (l.call)(self, caller, args).await;
        }
        match tool.name {
            "get_action" => {
                let a: ActionArgs = from_value(args, "")?;
                let wait = crate::core::usecases::reads::wait_seconds(
                    a.wait.map(|w| w.to_string()).as_deref(),
                )
                .map_err(|_| ApiError::invalid("/wait", "must be 0 to 20 seconds"))?;
                use crate::doors::http::deadline as status;
                let wait = status::within_deadline(
                    std::time::Duration::from_secs(wait),
                    facts.deadline_ms,
                    status::wall_ms(),
                    status::wait_reserve(facts.operation_timeout_ms),
                );
                let r = self
                    .reads
                    .action_wait(caller, a.action_id.as_str(), wait)
                    .await?;
                let text = format!("Action {} is {}", r.action_id, r.status);
                done(&ActionView::from(&r), text)
            }
            "portfolio_analysis" => {
                let a: AccountArgs = from_value(args, "")?;
                let p = self
                    .portfolio
                    .portfolio(caller, a.account_id.as_str())
                    .await?;
                let text = format!(
                    "{}: {} positions, gross notional {} USD, net {} USD, unrealized P&L {} USD",
                    p.account_id,
                    p.positions.len(),
                    p.totals.gross_notional,
                    p.totals.net_notional,
                    p.totals.unrealized_pnl
                );
                done(&p, text)
            }
            "allocation_breakdown" => {
                let a: AllocationArgs = from_value(args, "")?;
                let id = a.account_id.as_ref().map(|i| i.as_str());
                let v = self.portfolio.allocation(caller, id).await?;
                let months: Vec<String> = v
                    .by_contract_month
                    .iter()
                    .map(|s| format!("{} {}%", s.key, s.percent))
                    .collect();
                let text = format!(
                    "gross notional {} USD: {}",
                    v.gross_notional,
                    months.join(", ")
                );
                done(&v, text)
            }
            "risk_flags" => {
                let a: AccountArgs = from_value(args, "")?;
                let v = self
                    .portfolio
                    .risk_flags(caller, a.account_id.as_str())
                    .await?;
                let text = match v.flags.len() {
                    0 => format!("{}: no risk flags", v.account_id),
                    n => format!(
                        "{}: {n} risk flags: {}",
                        v.account_id,
                        v.flags
                            .iter()
                            .map(|f| format!("{} ({})", f.kind, f.severity))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                done(&v, text)
            }
            "execute_plan" => self.execute_plan(caller, args, facts).await,
            other => match actions::all().find(|a| a.plan_tool().name == other) {
                Some(a) => self.plan(caller, a, args, facts).await,
                None => Err(ApiError::new(Code::NotFound, format!("No tool {other}."))),
            },
        }
    }

    async fn plan(
        &self,
        caller: &Caller,
        action: &dyn Action,
        args: Value,
        facts: &ToolFacts,
    ) -> Result<ToolOutcome, ApiError> {
        // The payload's own type checks it first, with pointers into the arguments.
        action.check_payload(&args, "")?;
        let req = PlanRequest {
            action_type: action.action_type(),
            payload: args,
            requested_by: caller.operator.sub.clone(),
            chat_context: Some(chat(facts)),
        };
        let p = self.plan.plan(caller, req, &facts.request_id).await?;
        let text = match (&p.approval, p.executable) {
            (_, false) => format!("Plan {}: {} Not executable: a risk check failed.", p.plan_id, p.preview),
            (Some(a), true) => format!(
                "Plan {}: {} The operator approves it at {} before {}; then call execute_plan.",
                p.plan_id, p.preview, a.url, a.expires_at
            ),
            (None, true) => format!(
                "Plan {}: {} Show the preview to the operator; on their confirmation call execute_plan with the confirmation_token.",
                p.plan_id, p.preview
            ),
        };
        done(&p, text)
    }

    async fn execute_plan(
        &self,
        caller: &Caller,
        args: Value,
        facts: &ToolFacts,
    ) -> Result<ToolOutcome, ApiError> {
        let a: ExecuteArgs = from_value(args, "")?;
        let key = match a.idempotency_key {
            Some(k) => k,
            None => IdempotencyKey::parse(&derived_key(caller, a.plan_id.as_str()))
                .map_err(ApiError::internal)?,
        };
        let req = ExecuteRequest {
            plan_id: a.plan_id.as_str().to_string(),
            confirmation_token: a.confirmation_token,
            idempotency_key: key,
            requested_by: caller.operator.sub.clone(),
            chat_context: Some(chat(facts)),
        };
        let rf = RequestFacts {
            request_id: &facts.request_id,
            chat: chat(facts),
        };
        match self.execute.execute(caller, req, None, rf).await {
            Ok(ExecuteOutcome::Queued(x)) => {
                let text = format!(
                    "Queued action {} on {}; follow it with get_action.",
                    x.action_id, x.queue_target
                );
                done(&x, text)
            }
            Ok(ExecuteOutcome::Duplicate(x)) => {
                let text = format!(
                    "Already executed as action {} (duplicate); follow it with get_action.",
                    x.action_id
                );
                done(&x, text)
            }
            Err(e) if e.code == Code::ApprovalRequired => {
                let field = |k: &str| {
                    e.approval
                        .as_ref()
                        .and_then(|v| v.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string()
                };
                Ok(ToolOutcome::NeedsApproval {
                    plan_id: a.plan_id.as_str().to_string(),
                    url: field("url"),
                    expires_at: field("expires_at"),
                    message: e.message.clone(),
                })
            }
            Err(e) => Err(e),
        }
    }
}

fn chat(facts: &ToolFacts) -> ChatContext {
    ChatContext {
        chat_session_id: facts.chat_session_id.clone(),
        tool_call_id: facts.tool_call_id.clone(),
        extra: Default::default(),
    }
}

/// Counts a call refused before its tool ran (its arguments' text at fault), as
/// [`Tools::call`] counts the calls it runs.
pub fn refused(tool: &ToolDef) {
    metrics::counter!(crate::metrics::MCP_TOOL_CALLS, "tool" => tool.name, "outcome" => "error")
        .increment(1);
}

/// A tool error's structured content: the contract's error body.
pub fn error_body(e: &ApiError) -> Value {
    let mut err = json!({ "code": e.code.as_str(), "message": e.message });
    if !e.details.is_empty() {
        err["details"] = serde_json::to_value(&e.details).unwrap_or_default();
    }
    json!({ "error": err })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_objects_from_the_rest_types() {
        for t in catalog() {
            assert_eq!(t.input_schema["type"], "object", "{}", t.name);
            assert!(t.input_schema.get("$schema").is_none());
        }
        let order = catalog()
            .iter()
            .find(|t| t.name == "plan_cl_order")
            .unwrap();
        assert_eq!(order.name, "plan_cl_order");
        let props = order.input_schema["properties"].as_object().unwrap();
        for f in [
            "account_id",
            "symbol",
            "side",
            "quantity",
            "order_type",
            "limit_price",
            "time_in_force",
        ] {
            assert!(props.contains_key(f), "{f}");
        }
        let required: Vec<&str> = order.input_schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(required.contains(&"quantity") && !required.contains(&"time_in_force"));
        assert_eq!(order.input_schema["additionalProperties"], false);
    }
}
