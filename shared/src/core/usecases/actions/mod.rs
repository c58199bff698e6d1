//! One module per action type, each behind [`Action`]: how its payload is parsed and
//! described, which checks its plan runs and how its preview reads, what execute checks
//! again and reserves, what the worker does with it, and how the approval page shows it.
//! The use cases (plan, execute, the worker) and the doors (REST, MCP, the approval page,
//! OpenAPI) ask [`of`] for the type's module and never match on the type themselves.
//!
//! Adding an action type: its line in the domain's list (`core::domain`, `action_types!`:
//! its payload, queue and whether it can add risk), its module here, and its line in [`of`].

mod cancel;
mod replace_cl;
mod submit_cl;
mod sync;

pub use submit_cl::{notional, order_inputs_exposure, order_preview, CL_CONTRACT_BARRELS};

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::core::auth::Caller;
use crate::core::domain::{ActionStatus, ActionType, NormalizedPayload, Order};
use crate::core::error::ApiError;
use crate::core::parse::from_value;
use crate::core::ports::Reservation;
use crate::core::ports::Stored;
use crate::core::records::{ActionRecord, Control, PlanRecord, QueueMessage};
use crate::core::usecases::execute::Executor;
use crate::core::usecases::plan::{Evaluated, Planner};
use crate::core::usecases::worker::{Outcome, Worker};

/// The tool an agent plans this action type with (MCP).
pub struct PlanTool {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
}

/// What execute decided about an action's own checks: go on (reserving these contracts
/// in the atomic step, if any), or refuse and close the plan.
pub enum AtExecute {
    Go(Option<Reservation>),
    Refuse(ApiError),
}

/// One field of an action as the approval page shows it: its name, the value that will
/// be sent, and the value it replaces (for a change of an existing order).
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub value: String,
    pub before: Option<String>,
}

/// What a plan is evaluated in: the plan use case's ports, who asks, and the control
/// record read for this request.
#[derive(Clone, Copy)]
pub struct PlanContext<'a> {
    pub planner: &'a Planner,
    pub caller: &'a Caller,
    pub control: &'a Control,
}

/// The order record the worker claimed for the broker (types that create one).
pub type Claimed = Option<Stored<Order>>;

/// The worker's step: its outcome, and whether the step's own write settled the action.
pub type Worked = Result<(Outcome, bool), ApiError>;

/// An action type's payload as a Rust type: its JSON Schema (as part of a request and as
/// a document of its own) and its parse, given once per type by [`PayloadType::of`].
#[derive(Clone, Copy)]
pub struct PayloadType {
    schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
    root: fn() -> schemars::Schema,
    check: fn(&Value, &str) -> Result<(), ApiError>,
}

impl PayloadType {
    pub fn of<T: schemars::JsonSchema + DeserializeOwned>() -> Self {
        Self {
            schema: |g| g.subschema_for::<T>(),
            root: || schemars::schema_for!(T),
            check: |payload, at| from_value::<T>(payload.clone(), at).map(|_| ()),
        }
    }
}

/// Everything about one action type that differs from the others.
#[async_trait]
pub trait Action: Send + Sync {
    fn action_type(&self) -> ActionType;

    /// The MCP tool that plans it.
    fn plan_tool(&self) -> PlanTool;

    /// Its payload's Rust type: schema and parse.
    fn payload_type(&self) -> PayloadType;

    /// The JSON Schema of its payload, as a request sends it.
    fn payload_schema(&self, g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        (self.payload_type().schema)(g)
    }

    /// The JSON Schema of its payload as a document of its own (the MCP tool's input).
    fn root_schema(&self) -> schemars::Schema {
        (self.payload_type().root)()
    }

    /// Parses the payload only (a 400 naming the field at `at`), for doors that answer a
    /// malformed payload before anything else.
    fn check_payload(&self, payload: &Value, at: &str) -> Result<(), ApiError> {
        (self.payload_type().check)(payload, at)
    }

    /// The payload checked ([`Action::check_payload`]) and parsed as `T`.
    fn parsed<T: DeserializeOwned>(&self, payload: Value) -> Result<T, ApiError>
    where
        Self: Sized,
    {
        self.check_payload(&payload, "/payload")?;
        from_value(payload, "/payload")
    }

    /// The plan: parses and validates the payload, reads what the checks need, runs them,
    /// and settles the normalized payload and the preview.
    async fn evaluate(&self, cx: &PlanContext<'_>, payload: Value) -> Result<Evaluated, ApiError>;

    /// Whether the plan's confirmation weighs its notional (the four-eyes rule).
    fn weighs_notional(&self) -> bool {
        false
    }

    /// The action type whose confirmation mode (the policy's `confirmation`) confirms
    /// this payload: its own by default.
    fn confirmed_as(&self, _payload: &NormalizedPayload) -> ActionType {
        self.action_type()
    }

    /// At execute, after the plan, token, kill switch and rollout gates: the checks of
    /// this type that can change since the plan, under the policy in force now and at the
    /// reference price read now, and the contracts the atomic step reserves.
    async fn at_execute(
        &self,
        _ex: &Executor,
        _plan: &PlanRecord,
        _control: &Control,
    ) -> Result<AtExecute, ApiError> {
        Ok(AtExecute::Go(None))
    }

    /// The atomic step found the position outside the reservation's bounds: the full
    /// re-check, for a precise reason. `None`: it passes now (go again).
    async fn position_violation(
        &self,
        _ex: &Executor,
        _plan: &PlanRecord,
        _control: &Control,
    ) -> Result<Option<ApiError>, ApiError> {
        Ok(None)
    }

    /// At the worker, beside the action's move to `processing`: the order record claimed
    /// for the broker, for a type that creates one.
    async fn claim(
        &self,
        _w: &Worker,
        _msg: &QueueMessage,
        _now: crate::core::domain::Millis,
    ) -> Result<Claimed, ApiError> {
        Ok(None)
    }

    /// The worker's step. The answer's `bool`: the action was settled with the step's own
    /// write.
    async fn work(&self, w: &Worker, msg: &QueueMessage, claimed: Claimed) -> Worked;

    /// The worker gave up on the message (its last receive failed): how the action ends.
    async fn give_up(
        &self,
        _w: &Worker,
        _action: &ActionRecord,
        cause: &str,
    ) -> Result<(ActionStatus, Option<String>), ApiError> {
        Ok((
            ActionStatus::Failed,
            Some(format!(
                "processing failed after repeated attempts: {cause}"
            )),
        ))
    }

    /// The approval page's rows: the payload's fields in the order they were sent.
    fn fields(&self, payload: &NormalizedPayload) -> Vec<Field> {
        json_fields(&payload.to_json())
    }
}

/// The module of an action type: the registry.
pub fn of(a: ActionType) -> &'static dyn Action {
    match a {
        ActionType::OrderReplaceCl => &replace_cl::ReplaceCl,
        ActionType::OrderSubmitCl => &submit_cl::SubmitCl,
        ActionType::OrderCancel => &cancel::Cancel,
        ActionType::PositionsSync => &sync::Sync,
    }
}

/// Every registered action type's module, in the domain's order.
pub fn all() -> impl Iterator<Item = &'static dyn Action> {
    ActionType::ALL.iter().map(|a| of(*a))
}

/// The fields of a JSON object, each value as text (strings unquoted, `null` as "-").
pub fn json_fields(v: &Value) -> Vec<Field> {
    let Value::Object(m) = v else {
        return Vec::new();
    };
    m.iter()
        .map(|(k, v)| Field {
            name: k.clone(),
            value: text_of(v),
            before: None,
        })
        .collect()
}

/// A JSON value as the page prints it.
pub fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_action_type_has_its_own_module_and_tool() {
        let mut names = std::collections::BTreeSet::new();
        for a in ActionType::ALL {
            let m = of(*a);
            assert_eq!(
                m.action_type(),
                *a,
                "the registry maps {a} to its own module"
            );
            assert!(
                names.insert(m.plan_tool().name),
                "{a}: a tool name of its own"
            );
        }
    }
}
