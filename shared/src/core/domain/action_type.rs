//! The action types (each with its normalized payload, its queue and whether it can add
//! risk), the statuses of an action, and the queues.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::payload;

/// The action types, each with its normalized payload (`payload.rs`), the queue its work
/// travels on, and whether it can add risk (an order that may trade: the kill switch stops
/// it, a person confirms it by default). Generates [`ActionType`] and
/// [`payload::NormalizedPayload`]. This is the one list of them below the use cases; what
/// each type does is its module in `core::usecases::actions`, registered there.
macro_rules! action_types {
    ($($variant:ident => $text:literal, $payload:ty, $queue:ident, adds_risk: $risk:literal;)+) => {
        string_enum!(ActionType { $($variant => $text),+ });

        impl ActionType {
            pub fn queue_target(self) -> QueueTarget {
                match self { $(ActionType::$variant => QueueTarget::$queue),+ }
            }

            /// Whether an action of this type can add risk. One that can is stopped by the
            /// kill switch and confirmed by a person unless the policy says otherwise; a
            /// payload may still say that it does not ([`payload::Payload::adds_risk`]).
            pub fn can_add_risk(self) -> bool {
                match self { $(ActionType::$variant => $risk),+ }
            }
        }

        /// One normalized payload per action type. Stored and sent untagged: the variants
        /// cannot be mistaken for one another (each has a field the others lack, and a
        /// variant with every field of a later one is listed first).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(untagged)]
        pub enum NormalizedPayload { $($variant($payload)),+ }

        impl NormalizedPayload {
            pub fn action_type(&self) -> ActionType {
                match self { $(NormalizedPayload::$variant(_) => ActionType::$variant),+ }
            }

            /// The payload's own answers (account, message group, risk).
            pub fn payload(&self) -> &dyn payload::Payload {
                match self { $(NormalizedPayload::$variant(p) => p),+ }
            }
        }
    };
}

action_types! {
    OrderReplaceCl => "order.replace.cl", payload::NormalizedReplace, Orders, adds_risk: true;
    OrderSubmitCl => "order.submit.cl", payload::NormalizedOrder, Orders, adds_risk: true;
    OrderCancel => "order.cancel", payload::NormalizedCancel, Orders, adds_risk: false;
    PositionsSync => "positions.sync", payload::NormalizedSync, Jobs, adds_risk: false;
}
string_enum!(ActionStatus {
    Queued => "queued",
    Processing => "processing",
    Succeeded => "succeeded",
    Failed => "failed",
    Rejected => "rejected",
});
string_enum!(QueueTarget { Orders => "worker:orders", Jobs => "worker:jobs" });

impl QueueTarget {
    /// The queue's short name (`orders`, `jobs`): metric labels, `airlock queues`.
    pub fn short_name(self) -> &'static str {
        match self {
            QueueTarget::Orders => "orders",
            QueueTarget::Jobs => "jobs",
        }
    }
}

impl ActionStatus {
    /// `succeeded`, `failed` (and the reserved `rejected`): nothing will change any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ActionStatus::Succeeded | ActionStatus::Failed | ActionStatus::Rejected
        )
    }
}

impl ActionType {
    /// A new order: its action creates an order record (checked against the position
    /// limit and the kill switch at the worker before the broker sees it).
    pub fn is_order_submission(self) -> bool {
        self.as_str().starts_with("order.submit.")
    }
}
