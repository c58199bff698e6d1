//! `order.cancel`: cancel an open order. It reduces risk, so it runs while the kill switch
//! is engaged and on a suspended account, and the caller's token confirms it by default.
//! It travels in the account's cancel group; the worker asks the broker to cancel.

use async_trait::async_trait;
use serde_json::Value;

use super::{Action, Claimed, PayloadType, PlanContext, PlanTool, Worked};
use crate::core::domain::payload::{NormalizedCancel, NormalizedPayload};
use crate::core::domain::{ActionType, OrderCancel};
use crate::core::error::ApiError;
use crate::core::policy::{self, CancelInputs};
use crate::core::records::QueueMessage;
use crate::core::usecases::plan::Evaluated;
use crate::core::usecases::reads::visible_account;
use crate::core::usecases::worker::{self, Worker};

pub struct Cancel;

#[async_trait]
impl Action for Cancel {
    fn action_type(&self) -> ActionType {
        ActionType::OrderCancel
    }

    fn plan_tool(&self) -> PlanTool {
        PlanTool {
            name: "plan_cancel_order",
            title: "Plan an order cancel",
            description: "Validate cancelling an open order. Returns a preview and a confirmation_token for execute_plan. Cancels nothing by itself.",
        }
    }

    fn payload_type(&self) -> PayloadType {
        PayloadType::of::<OrderCancel>()
    }

    async fn evaluate(&self, cx: &PlanContext<'_>, payload: Value) -> Result<Evaluated, ApiError> {
        evaluate_cancel(cx, self.parsed(payload)?).await
    }

    async fn work(&self, w: &Worker, msg: &QueueMessage, _claimed: Claimed) -> Worked {
        Ok((worker::cancel(w, msg).await?, false))
    }
}

async fn evaluate_cancel(cx: &PlanContext<'_>, c: OrderCancel) -> Result<Evaluated, ApiError> {
    let PlanContext {
        planner: state,
        caller,
        control,
    } = *cx;
    let account = visible_account(state.accounts.as_ref(), caller, c.account_id.as_str()).await?;
    let order = state.orders.get_order(c.order_id.as_str()).await?;
    let checks = policy::check_order_cancel(
        &CancelInputs {
            policy: policy::in_force(&state.policy, control),
            account: &account,
            order: order.as_ref(),
            order_id: c.order_id.as_str(),
        },
        control,
    );
    let detail = match &order {
        Some(o) if o.terms.account_id == account.account_id => format!(
            " ({} {} {} {}, {})",
            o.terms.side, o.terms.quantity, o.terms.symbol, o.terms.order_type, o.status
        ),
        _ => String::new(),
    };
    Ok(Evaluated {
        preview: format!(
            "Cancel order {}{detail} on {}.",
            c.order_id, account.account_id
        ),
        normalized: NormalizedPayload::OrderCancel(NormalizedCancel {
            account_id: account.account_id.clone(),
            order_id: c.order_id.as_str().to_string(),
        }),
        account,
        checks,
        reference: None,
        notional: None,
    })
}
