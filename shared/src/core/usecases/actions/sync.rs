//! `positions.sync`: rebuild an account's positions from the broker's view, as a job on
//! the jobs queue. It changes no order, so the kill switch does not stop it.

use async_trait::async_trait;
use serde_json::Value;

use super::{parses_as, Action, PlanTool};
use crate::core::auth::Caller;
use crate::core::domain::payload::{NormalizedPayload, NormalizedSync};
use crate::core::domain::{ActionType, PositionsSync};
use crate::core::error::ApiError;
use crate::core::parse::from_value;
use crate::core::policy;
use crate::core::records::{Control, QueueMessage};
use crate::core::usecases::plan::{Evaluated, Planner};
use crate::core::usecases::reads::visible_account;
use crate::core::usecases::worker::{self, Outcome, Worker};

pub struct Sync;

#[async_trait]
impl Action for Sync {
    fn action_type(&self) -> ActionType {
        ActionType::PositionsSync
    }

    fn plan_tool(&self) -> PlanTool {
        PlanTool {
            name: "plan_positions_sync",
            title: "Plan a positions sync",
            description: "Plan rebuilding an account's positions from the broker's view. Returns a preview and a confirmation_token for execute_plan.",
        }
    }

    fn payload_schema(&self, g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        g.subschema_for::<PositionsSync>()
    }

    fn root_schema(&self) -> schemars::Schema {
        schemars::schema_for!(PositionsSync)
    }

    fn check_payload(&self, payload: &Value, at: &str) -> Result<(), ApiError> {
        parses_as::<PositionsSync>(payload, at)
    }

    async fn evaluate(
        &self,
        planner: &Planner,
        caller: &Caller,
        payload: Value,
        control: &Control,
    ) -> Result<Evaluated, ApiError> {
        let s: PositionsSync = from_value(payload, "/payload")?;
        evaluate_sync(planner, caller, s, control).await
    }

    async fn work(
        &self,
        w: &Worker,
        msg: &QueueMessage,
        _claimed: Option<crate::core::ports::Stored<crate::core::domain::Order>>,
    ) -> Result<(Outcome, bool), ApiError> {
        Ok((worker::sync(w, msg).await?, false))
    }
}

async fn evaluate_sync(
    state: &Planner,
    caller: &Caller,
    s: PositionsSync,
    control: &Control,
) -> Result<Evaluated, ApiError> {
    let account = visible_account(state.accounts.as_ref(), caller, s.account_id.as_str()).await?;
    let checks =
        policy::check_positions_sync(policy::in_force(&state.policy, control), &account, control);
    Ok(Evaluated {
        preview: format!(
            "Rebuild the positions of {} from the broker's view and record what changed.",
            account.account_id
        ),
        normalized: NormalizedPayload::PositionsSync(NormalizedSync {
            account_id: account.account_id.clone(),
        }),
        account,
        checks,
        reference: None,
        notional: None,
    })
}
