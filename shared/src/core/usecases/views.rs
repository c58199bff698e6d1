//! The JSON shapes of the read answers, one typed view per resource, for every front door
//! (the REST handlers today; the MCP tools next): flat objects, RFC 3339 times, prices as
//! decimal strings. Storage records never go out as they are: a view names what a caller
//! may see.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::core::domain::{
    Account, AccountStatus, ActionStatus, ActionType, Job, JobKind, JobStatus, Order, OrderStatus,
    OrderType, OrderVersion, Position, Price, QueueTarget, Rfc3339, Side, TimeInForce,
};
use crate::core::records::{ActionRecord, ResourceRefs};
use crate::core::usecases::reads::Listing;

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AccountView<'a> {
    pub account_id: &'a str,
    pub name: &'a str,
    pub desk: &'a str,
    pub currency: &'a str,
    pub status: AccountStatus,
}

impl<'a> From<&'a Account> for AccountView<'a> {
    fn from(a: &'a Account) -> Self {
        AccountView {
            account_id: &a.account_id,
            name: &a.name,
            desk: &a.desk,
            currency: &a.currency,
            status: a.status,
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PositionView<'a> {
    pub account_id: &'a str,
    pub symbol: &'a str,
    pub quantity: i64,
    pub avg_price: Option<Price>,
    #[schemars(with = "String")]
    pub updated_at: Rfc3339,
}

impl<'a> From<&'a Position> for PositionView<'a> {
    fn from(p: &'a Position) -> Self {
        PositionView {
            account_id: &p.account_id,
            symbol: &p.symbol,
            quantity: p.quantity,
            avg_price: p.avg_price,
            updated_at: Rfc3339(p.updated_at),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrderView<'a> {
    pub order_id: &'a str,
    pub account_id: &'a str,
    pub symbol: &'a str,
    pub side: Side,
    pub quantity: u32,
    pub order_type: OrderType,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
    pub status: OrderStatus,
    pub filled_quantity: u32,
    pub avg_fill_price: Option<Price>,
    pub action_id: Option<&'a str>,
    #[schemars(with = "String")]
    pub created_at: Rfc3339,
    #[schemars(with = "String")]
    pub updated_at: Rfc3339,
    /// 1 as submitted, one more with each replace of its terms.
    pub version: u32,
    /// The terms of each earlier version, oldest first (empty until a replace).
    pub versions: Vec<OrderVersionView<'a>>,
}

/// An order's terms up to a replace: the version they were, when and by which action
/// they were replaced.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct OrderVersionView<'a> {
    pub version: u32,
    pub quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
    #[schemars(with = "String")]
    pub replaced_at: Rfc3339,
    pub replaced_by: &'a str,
}

impl<'a> From<&'a OrderVersion> for OrderVersionView<'a> {
    fn from(v: &'a OrderVersion) -> Self {
        OrderVersionView {
            version: v.version,
            quantity: v.quantity,
            limit_price: v.limit_price,
            stop_price: v.stop_price,
            time_in_force: v.time_in_force,
            replaced_at: Rfc3339(v.replaced_at),
            replaced_by: &v.replaced_by,
        }
    }
}

impl<'a> From<&'a Order> for OrderView<'a> {
    fn from(o: &'a Order) -> Self {
        OrderView {
            order_id: &o.order_id,
            account_id: &o.terms.account_id,
            symbol: &o.terms.symbol,
            side: o.terms.side,
            quantity: o.terms.quantity,
            order_type: o.terms.order_type,
            limit_price: o.terms.limit_price,
            stop_price: o.terms.stop_price,
            time_in_force: o.terms.time_in_force,
            status: o.status,
            filled_quantity: o.filled_quantity,
            avg_fill_price: o.avg_fill_price,
            action_id: o.action_id.as_deref(),
            created_at: Rfc3339(o.created_at),
            updated_at: Rfc3339(o.updated_at),
            version: o.version,
            versions: o.versions.iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct JobView<'a> {
    pub job_id: &'a str,
    pub kind: JobKind,
    pub status: JobStatus,
    pub account_id: Option<&'a str>,
    pub action_id: Option<&'a str>,
    #[schemars(with = "String")]
    pub created_at: Rfc3339,
    #[schemars(with = "String")]
    pub updated_at: Rfc3339,
    pub error: Option<&'a str>,
    pub result: Option<&'a serde_json::Value>,
}

impl<'a> From<&'a Job> for JobView<'a> {
    fn from(j: &'a Job) -> Self {
        JobView {
            job_id: &j.job_id,
            kind: j.kind,
            status: j.status,
            account_id: j.account_id.as_deref(),
            action_id: j.action_id.as_deref(),
            created_at: Rfc3339(j.created_at),
            updated_at: Rfc3339(j.updated_at),
            error: j.error.as_deref(),
            result: j.result.as_ref(),
        }
    }
}

/// `GET /actions/{action_id}`: the action's status, never its message or its key.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ActionView<'a> {
    pub action_id: &'a str,
    pub plan_id: &'a str,
    pub action_type: ActionType,
    pub status: ActionStatus,
    pub queue_target: QueueTarget,
    pub resource_refs: &'a ResourceRefs,
    #[schemars(with = "String")]
    pub created_at: Rfc3339,
    #[schemars(with = "String")]
    pub updated_at: Rfc3339,
    pub error: Option<&'a str>,
}

impl<'a> From<&'a ActionRecord> for ActionView<'a> {
    fn from(a: &'a ActionRecord) -> Self {
        ActionView {
            action_id: &a.action_id,
            plan_id: &a.plan_id,
            action_type: a.action_type,
            status: a.status,
            queue_target: a.queue_target,
            resource_refs: &a.resource_refs,
            created_at: Rfc3339(a.created_at),
            updated_at: Rfc3339(a.updated_at),
            error: a.error.as_deref(),
        }
    }
}

/// One page of a listing: `{ "<name>": [views...], "next_cursor": ... }`.
pub struct ListingView<'a, T> {
    pub name: &'static str,
    pub listing: &'a Listing<T>,
}

impl<'a, T> Serialize for ListingView<'a, T>
where
    &'a T: Into<<T as Viewed<'a>>::View>,
    T: Viewed<'a>,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rows: Vec<T::View> = self.listing.rows.iter().map(Into::into).collect();
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry(self.name, &rows)?;
        m.serialize_entry("next_cursor", &self.listing.next_cursor)?;
        m.end()
    }
}

/// The view a stored row goes out as.
pub trait Viewed<'a>: 'a {
    type View: Serialize;
}

impl<'a> Viewed<'a> for Account {
    type View = AccountView<'a>;
}
impl<'a> Viewed<'a> for Position {
    type View = PositionView<'a>;
}
impl<'a> Viewed<'a> for Order {
    type View = OrderView<'a>;
}
impl<'a> Viewed<'a> for Job {
    type View = JobView<'a>;
}
