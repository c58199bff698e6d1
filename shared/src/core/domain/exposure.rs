//! An account's exposure in a contract, and the increments that change it.

use serde::{Deserialize, Serialize};

use super::{Order, OrderStatus, Side};

/// An account's exposure in one contract: its filled position and the contracts its open
/// orders (queued, submitted, working, partially filled) may still buy or sell. Position
/// limits hold against the worst case on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposure {
    pub position: i64,
    pub open_buy: i64,
    pub open_sell: i64,
}

impl Exposure {
    /// The position if every open buy fills and no open sell does.
    pub fn worst_long(&self) -> i64 {
        self.position.saturating_add(self.open_buy)
    }

    /// The position if every open sell fills and no open buy does.
    pub fn worst_short(&self) -> i64 {
        self.position.saturating_sub(self.open_sell)
    }

    /// Whether one more order on `side` leaves the worst case on that side within `bound`
    /// (before the order's own contracts are added): for a buy `worst_long <= bound`, for a
    /// sell `worst_short >= bound`.
    pub fn leaves_room(&self, side: Side, bound: i64) -> bool {
        match side {
            Side::Buy => self.worst_long() <= bound,
            Side::Sell => self.worst_short() >= bound,
        }
    }
}

/// A change of one account's exposure in one contract, applied as increments so that
/// concurrent writers (an execute reserving, a worker recording a fill) never conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposureDelta {
    pub account_id: String,
    pub symbol: String,
    pub position: i64,
    pub open_buy: i64,
    pub open_sell: i64,
    /// Orders of this contract claimed for the broker (`submitted`) and not yet recorded:
    /// +1 as an order is claimed, -1 as it leaves `submitted`. A sync does not replace
    /// the position while one is (the broker may hold a fill the order has not recorded).
    pub submitting: i64,
}

impl ExposureDelta {
    fn open(account_id: &str, symbol: &str, side: Side, open: i64, position: i64) -> Self {
        let (open_buy, open_sell) = match side {
            Side::Buy => (open, 0),
            Side::Sell => (0, open),
        };
        ExposureDelta {
            account_id: account_id.to_string(),
            symbol: symbol.to_string(),
            position,
            open_buy,
            open_sell,
            submitting: 0,
        }
    }

    /// A sync moving a position (no open quantity changes).
    pub fn position_moved(account_id: &str, symbol: &str, by: i64) -> Self {
        Self::open(account_id, symbol, Side::Buy, 0, by)
    }

    /// An accepted order's contracts, reserved at execute until the order ends.
    pub fn reserve(account_id: &str, symbol: &str, side: Side, quantity: i64) -> Self {
        Self::open(account_id, symbol, side, quantity, 0)
    }

    /// What an order's step from `prev` to `next` does to the exposure: a new fill moves
    /// contracts from open to the position; an order that ends releases its open rest.
    pub fn of_order_step(prev: &Order, next: &Order) -> Self {
        let filled = next.filled_quantity as i64 - prev.filled_quantity as i64;
        let submitting = |o: &Order| i64::from(o.status == OrderStatus::Submitted);
        Self {
            submitting: submitting(next) - submitting(prev),
            ..Self::open(
                &next.terms.account_id,
                &next.terms.symbol,
                next.terms.side,
                next.open_quantity() - prev.open_quantity(),
                next.terms.side.sign() * filled,
            )
        }
    }

    /// What creating `order` does to the exposure: the step from the order as execute
    /// reserved it (`queued`, nothing filled) to `order`. Creating it `queued` changes
    /// nothing; `submitted` claims it for the broker; `rejected` releases the reservation.
    pub fn of_order_created(order: &Order) -> Self {
        let reserved = Order {
            status: OrderStatus::Queued,
            filled_quantity: 0,
            avg_fill_price: None,
            ..order.clone()
        };
        Self::of_order_step(&reserved, order)
    }

    pub fn is_zero(&self) -> bool {
        self.position == 0 && self.open_buy == 0 && self.open_sell == 0 && self.submitting == 0
    }

    /// The change of the worst long (`position + open_buy`).
    pub fn worst_long(&self) -> i64 {
        self.position + self.open_buy
    }

    /// The change of the worst short (`position - open_sell`).
    pub fn worst_short(&self) -> i64 {
        self.position - self.open_sell
    }
}
