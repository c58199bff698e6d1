//! The closed sets of orders, jobs and accounts, as the API spells them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

string_enum!(Side { Buy => "buy", Sell => "sell" });
string_enum!(OrderType { Market => "market", Limit => "limit", Stop => "stop", StopLimit => "stop_limit" });
string_enum!(TimeInForce { Day => "day", Gtc => "gtc", Ioc => "ioc", Fok => "fok" });
string_enum!(OrderStatus {
    Queued => "queued",
    Submitted => "submitted",
    Working => "working",
    PartiallyFilled => "partially_filled",
    Filled => "filled",
    Cancelled => "cancelled",
    Rejected => "rejected",
});
string_enum!(JobKind { PositionsSync => "positions.sync" });
string_enum!(JobStatus { Queued => "queued", Running => "running", Succeeded => "succeeded", Failed => "failed" });
string_enum!(AccountStatus { Active => "active", Suspended => "suspended", Closed => "closed" });

impl OrderStatus {
    /// An order that may still trade: it counts against the position limit until it is
    /// filled, cancelled or rejected.
    pub fn is_open(self) -> bool {
        self.is_cancellable()
    }

    /// An order the broker has, or may have (claimed for it), that has not ended: what
    /// reconciliation asks the broker about.
    pub fn is_at_the_broker(self) -> bool {
        matches!(
            self,
            OrderStatus::Submitted | OrderStatus::Working | OrderStatus::PartiallyFilled
        )
    }

    /// An order that can still be cancelled at the broker.
    pub fn is_cancellable(self) -> bool {
        matches!(
            self,
            OrderStatus::Queued
                | OrderStatus::Submitted
                | OrderStatus::Working
                | OrderStatus::PartiallyFilled
        )
    }
}

impl Side {
    /// +1 for buy, -1 for sell: the sign an order adds to a position.
    pub fn sign(self) -> i64 {
        match self {
            Side::Buy => 1,
            Side::Sell => -1,
        }
    }
}
