//! The paper broker: a broker that trades against a reference price table instead of a
//! market. Market orders fill at the reference price; limit and stop orders rest as working
//! and fill when the reference price crosses them (checked on every submit and on
//! `airlock prices set`); cancels act on working orders; a limit or stop price further
//! than the band from the reference is rejected, as a real broker's price-band check would.
//! IOC and FOK orders that cannot fill at once are cancelled.
//!
//! Its book lives in [`PaperBookStore`] documents (the price table, one book per account),
//! written with optimistic concurrency, so it survives worker crashes like a real broker.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use super::broker::{Broker, BrokerOrder, BrokerPosition, BrokerStatus};
use crate::domain::{OrderType, Price, Side, TimeInForce};
use crate::error::{StoreError, StoreResult};
use crate::ports::PaperBookStore;

pub const PRICES_KEY: &str = "prices";
const MAX_ROUNDS: usize = 16;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccountBook {
    pub orders: BTreeMap<String, BrokerOrder>,
    pub positions: BTreeMap<String, BrokerPosition>,
}

pub struct PaperBroker {
    store: Arc<dyn PaperBookStore>,
}

fn account_key(account_id: &str) -> String {
    format!("account:{account_id}")
}

fn decode<T: serde::de::DeserializeOwned + Default>(
    v: Option<serde_json::Value>,
) -> StoreResult<T> {
    match v {
        None => Ok(T::default()),
        Some(v) => {
            serde_json::from_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
        }
    }
}

fn encode<T: Serialize>(v: &T) -> StoreResult<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
}

/// The price band: 20 % of the reference, at least 5.00.
fn band(reference: Decimal) -> Decimal {
    (reference.abs() * Decimal::new(2, 1)).max(Decimal::new(5, 0))
}

/// Whether a working order trades at `reference` (stops trigger first), and at what price.
fn crossing(o: &mut BrokerOrder, reference: Price) -> Option<Price> {
    let r = reference.value();
    let buy = o.side == Side::Buy;
    if matches!(o.order_type, OrderType::Stop | OrderType::StopLimit) && !o.triggered {
        let stop = o.stop_price?.value();
        o.triggered = if buy { r >= stop } else { r <= stop };
        if !o.triggered {
            return None;
        }
    }
    match o.order_type {
        OrderType::Market | OrderType::Stop => Some(reference),
        OrderType::Limit | OrderType::StopLimit => {
            let limit = o.limit_price?.value();
            let marketable = if buy { r <= limit } else { r >= limit };
            marketable.then_some(reference)
        }
    }
}

/// Applies a fill of `qty` at `price` to a position: signed quantity, average price of the
/// open position (unchanged when reducing, the fill price when opening or flipping).
pub fn apply_fill(
    quantity: i64,
    avg: Option<Price>,
    side: Side,
    qty: u32,
    price: Price,
) -> (i64, Option<Price>) {
    let delta = side.sign() * qty as i64;
    let after = quantity + delta;
    let avg = if after == 0 {
        None
    } else if quantity == 0 || quantity.signum() != after.signum() {
        Some(price)
    } else if quantity.signum() == delta.signum() {
        // Adding to the position: weighted average.
        let old = avg.map(|p| p.value()).unwrap_or(price.value());
        let total =
            old * Decimal::from(quantity.abs()) + price.value() * Decimal::from(delta.abs());
        Some(Price::new((total / Decimal::from(after.abs())).round_dp(6)))
    } else {
        avg
    };
    (after, avg)
}

impl AccountBook {
    fn fill(&mut self, coid: &str, price: Price) {
        let Some(o) = self.orders.get_mut(coid) else {
            return;
        };
        let qty = o.quantity - o.filled_quantity;
        o.status = BrokerStatus::Filled;
        o.filled_quantity = o.quantity;
        o.avg_fill_price = Some(price);
        let (side, symbol) = (o.side, o.symbol.clone());
        let pos = self
            .positions
            .entry(symbol.clone())
            .or_insert(BrokerPosition {
                symbol,
                quantity: 0,
                avg_price: None,
            });
        let (q, avg) = apply_fill(pos.quantity, pos.avg_price, side, qty, price);
        pos.quantity = q;
        pos.avg_price = avg;
    }
}

impl PaperBroker {
    pub fn new(store: Arc<dyn PaperBookStore>) -> Self {
        PaperBroker { store }
    }

    pub async fn prices(&self) -> StoreResult<BTreeMap<String, Price>> {
        decode(self.store.load(PRICES_KEY).await?.0)
    }

    /// Sets reference prices (seeding, or `airlock prices set`).
    pub async fn set_prices(&self, prices: &BTreeMap<String, Price>) -> StoreResult<()> {
        for _ in 0..MAX_ROUNDS {
            let (doc, version) = self.store.load(PRICES_KEY).await?;
            let mut table: BTreeMap<String, Price> = decode(doc)?;
            table.extend(prices.iter().map(|(k, v)| (k.clone(), *v)));
            if self
                .store
                .save(PRICES_KEY, &encode(&table)?, version)
                .await?
            {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable(
            "paper broker price table: too much contention".into(),
        ))
    }

    /// Seeds an account's positions (the broker's view at start).
    pub async fn seed_positions(
        &self,
        account_id: &str,
        positions: &[BrokerPosition],
    ) -> StoreResult<()> {
        self.update(account_id, |book| {
            for p in positions {
                book.positions.insert(p.symbol.clone(), p.clone());
            }
            Ok(())
        })
        .await
        .map(|_| ())
    }

    /// Loads an account's book, lets `f` change it, saves it at the version read (again on
    /// a conflict). Returns what `f` returned.
    async fn update<R>(
        &self,
        account_id: &str,
        mut f: impl FnMut(&mut AccountBook) -> StoreResult<R>,
    ) -> StoreResult<R> {
        let key = account_key(account_id);
        for _ in 0..MAX_ROUNDS {
            let (doc, version) = self.store.load(&key).await?;
            let mut book: AccountBook = decode(doc)?;
            let out = f(&mut book)?;
            if self.store.save(&key, &encode(&book)?, version).await? {
                return Ok(out);
            }
        }
        Err(StoreError::Unavailable(
            "paper broker book: too much contention".into(),
        ))
    }

    pub async fn book(&self, account_id: &str) -> StoreResult<AccountBook> {
        decode(self.store.load(&account_key(account_id)).await?.0)
    }
}

#[async_trait]
impl Broker for PaperBroker {
    async fn submit(&self, order: &BrokerOrder) -> StoreResult<BrokerOrder> {
        let prices = self.prices().await?;
        let reference = prices.get(&order.symbol).copied();
        self.update(&order.account_id, |book| {
            if let Some(existing) = book.orders.get(&order.client_order_id) {
                // Duplicate client order id: the same order, not a new one.
                return Ok(existing.clone());
            }
            let mut o = order.clone();
            o.status = BrokerStatus::Working;
            o.filled_quantity = 0;
            o.avg_fill_price = None;
            o.triggered = false;
            let Some(reference) = reference else {
                o.status = BrokerStatus::Rejected;
                o.reason = Some(format!("no reference price for {}", o.symbol));
                book.orders.insert(o.client_order_id.clone(), o.clone());
                return Ok(o);
            };
            for p in [o.limit_price, o.stop_price].into_iter().flatten() {
                if (p.value() - reference.value()).abs() > band(reference.value()) {
                    o.status = BrokerStatus::Rejected;
                    o.reason = Some(format!(
                        "price {p} is outside the broker's band around the reference {reference}"
                    ));
                    book.orders.insert(o.client_order_id.clone(), o.clone());
                    return Ok(o);
                }
            }
            let fill = crossing(&mut o, reference);
            let coid = o.client_order_id.clone();
            let immediate = matches!(o.time_in_force, TimeInForce::Ioc | TimeInForce::Fok);
            if fill.is_none() && immediate {
                o.status = BrokerStatus::Cancelled;
                o.reason = Some(format!("{} order could not fill at once", o.time_in_force));
            }
            book.orders.insert(coid.clone(), o);
            if let Some(price) = fill {
                book.fill(&coid, price);
            }
            Ok(book.orders[&coid].clone())
        })
        .await
    }

    async fn cancel(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>> {
        self.update(account_id, |book| {
            Ok(book.orders.get_mut(client_order_id).map(|o| {
                if matches!(
                    o.status,
                    BrokerStatus::Working | BrokerStatus::PartiallyFilled
                ) {
                    o.status = BrokerStatus::Cancelled;
                    o.reason = Some("cancelled on request".into());
                }
                o.clone()
            }))
        })
        .await
    }

    async fn order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>> {
        let prices = self.prices().await?;
        self.update(account_id, |book| {
            let Some(o) = book.orders.get_mut(client_order_id) else {
                return Ok(None);
            };
            if o.status == BrokerStatus::Working {
                if let Some(reference) = prices.get(&o.symbol).copied() {
                    if let Some(price) = crossing(o, reference) {
                        book.fill(client_order_id, price);
                    }
                }
            }
            Ok(book.orders.get(client_order_id).cloned())
        })
        .await
    }

    async fn positions(&self, account_id: &str) -> StoreResult<Vec<BrokerPosition>> {
        Ok(self
            .book(account_id)
            .await?
            .positions
            .into_values()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Price {
        Price::parse(s).unwrap()
    }

    #[test]
    fn fills_move_positions_and_average_prices() {
        assert_eq!(
            apply_fill(0, None, Side::Buy, 2, p("70")),
            (2, Some(p("70")))
        );
        assert_eq!(
            apply_fill(2, Some(p("70")), Side::Buy, 2, p("72")),
            (4, Some(p("71")))
        );
        assert_eq!(
            apply_fill(4, Some(p("71")), Side::Sell, 1, p("75")),
            (3, Some(p("71")))
        );
        assert_eq!(
            apply_fill(3, Some(p("71")), Side::Sell, 3, p("75")),
            (0, None)
        );
        assert_eq!(
            apply_fill(1, Some(p("71")), Side::Sell, 3, p("69")),
            (-2, Some(p("69")))
        );
    }

    #[test]
    fn limits_and_stops_cross_the_reference() {
        let mut o = BrokerOrder {
            client_order_id: "o".into(),
            account_id: "A".into(),
            symbol: "CLF27".into(),
            side: Side::Buy,
            quantity: 1,
            order_type: OrderType::Limit,
            limit_price: Some(p("68.00")),
            stop_price: None,
            time_in_force: TimeInForce::Day,
            status: BrokerStatus::Working,
            filled_quantity: 0,
            avg_fill_price: None,
            reason: None,
            triggered: false,
        };
        assert_eq!(crossing(&mut o, p("68.40")), None);
        assert_eq!(crossing(&mut o, p("67.90")), Some(p("67.90")));
        o.order_type = OrderType::Stop;
        o.stop_price = Some(p("70.00"));
        assert_eq!(crossing(&mut o, p("69.99")), None);
        assert!(!o.triggered);
        assert_eq!(crossing(&mut o, p("70.10")), Some(p("70.10")));
        assert!(o.triggered);
    }
}
