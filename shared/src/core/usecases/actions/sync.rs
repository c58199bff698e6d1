//! `positions.sync`: rebuild an account's positions from the broker's view, as a job on
//! the jobs queue. It changes no order, so the kill switch does not stop it.

use async_trait::async_trait;
use serde_json::Value;

use super::{Action, Claimed, PayloadType, PlanContext, PlanTool, Worked};
use crate::core::domain::payload::{NormalizedPayload, NormalizedSync};
use crate::core::domain::{ActionType, PositionsSync};
use crate::core::error::ApiError;
use crate::core::policy;
use crate::core::records::QueueMessage;
use crate::core::usecases::plan::Evaluated;
use crate::core::usecases::reads::visible_account;
use crate::core::usecases::worker::{self, Worker};

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

    fn payload_type(&self) -> PayloadType {
        PayloadType::of::<PositionsSync>()
    }

    async fn evaluate(&self, cx: &PlanContext<'_>, payload: Value) -> Result<Evaluated, ApiError> {
        evaluate_sync(cx, self.parsed(payload)?).await
    }

    async fn work(&self, w: &Worker, msg: &QueueMessage, _claimed: Claimed) -> Worked {
        Ok((worker::sync(w, msg).await?, false))
    }
}

async fn evaluate_sync(cx: &PlanContext<'_>, s: PositionsSync) -> Result<Evaluated, ApiError> {
    let PlanContext {
        planner: state,
        caller,
        control,
    } = *cx;
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
