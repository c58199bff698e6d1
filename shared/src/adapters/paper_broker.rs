//! The paper broker: a broker that trades against a reference price table instead of a
//! market. Market orders fill at the reference price; limit and stop orders rest as working
//! and fill when the reference price crosses them (checked on every submit and on
//! `airlock prices set`); cancels act on working orders; a limit or stop price further
//! than the band from the reference is rejected, as a real broker's price-band check would.
//! IOC and FOK orders that cannot fill at once are cancelled.
//!
//! It keeps its state in [`PaperBookStore`] documents, written with optimistic concurrency,
//! so it survives worker crashes like a real broker:
//!
//! - `prices`: the reference price table;
//! - `account:{account}`: the account's book, which holds its positions only;
//! - `order:{account}:{client order id}`: one document per order the broker accepted.
//!
//! **One document per order, never a history per account.** An order's document is created
//! only if absent, in the same all-or-nothing write ([`PaperBookStore::save_all`]) as the
//! position change of its fill, so deduplication on the client order id is exact and has no
//! time limit: a resend of any client order id, however many orders later, finds the document
//! and gets the same order back, and nothing is evicted. Every operation reads and writes at
//! most three small documents (the price table, the book, the order), so its cost does not
//! grow with the number of orders an account has had. Bounds: the book is about 100 bytes
//! per symbol held (an account holds few), an order document about 300 bytes, far from
//! DynamoDB's 400 KB item limit; what grows is the number of order documents, one per order,
//! as a broker's order history (and Airlock's own `orders` table) does. Books written before
//! this layout kept every order inside the account document; the first operation on such an
//! account gives each of those orders its own document and drops them from the book.
//!
//! **Writers of one account's book take turns.** Every order of an account that fills moves
//! the one book, and the workers handle an account's contracts (their message groups) at the
//! same time. Left to optimistic concurrency alone, concurrent writers in one process each
//! read the book, all but one lose the write, and all read again at once: with six or more
//! of them, one could lose every round and fail its message, retried seconds later. So in
//! a process the writers of an account's book queue for it ([`PaperBroker::book_turn`]);
//! between processes (Lambdas, `airlock prices set`) the versions still decide, and a
//! writer that lost a round waits a random moment, longer each round, before reading again
//! ([`pause`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::core::clock::SharedClock;
use crate::core::domain::fills::{average_after, try_apply_fill};
use crate::core::domain::{Millis, OrderType, Price, Side, TimeInForce};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::broker::{
    Broker, BrokerOrder, BrokerOrderVersion, BrokerPosition, BrokerStatus, ReplaceOutcome,
    Replacement,
};
use crate::core::ports::{PaperBookStore, PaperDoc, Prices};

pub const PRICES_KEY: &str = "prices";
const MAX_ROUNDS: usize = 16;

/// Before round `round` of a read-and-write that lost the one before (another process wrote
/// the document in between): a random pause of up to 2^round ms, 64 ms at most, so that
/// contenders spread out instead of colliding again at once. None before the first round.
async fn pause(round: usize) {
    if round == 0 {
        return;
    }
    let most = 1u64 << round.min(6);
    let ms = rand::Rng::gen_range(&mut rand::thread_rng(), 0..=most);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

/// An account's book as stored: its positions. `orders` is only ever non-empty in a book
/// written before orders had their own documents; it is emptied on first use.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct StoredBook {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    orders: BTreeMap<String, BrokerOrder>,
    #[serde(default)]
    positions: BTreeMap<String, BrokerPosition>,
}

/// An account as the broker sees it (for the CLI): every order it accepted, by client
/// order id, and its positions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccountBook {
    pub orders: BTreeMap<String, BrokerOrder>,
    pub positions: BTreeMap<String, BrokerPosition>,
}

pub struct PaperBroker {
    store: Arc<dyn PaperBookStore>,
    /// The price table as last decoded, with its version: every plan and every order reads
    /// it, and it changes only with `airlock prices set` (possibly in another process), so
    /// each read asks the store whether the version moved and decodes only when it did.
    prices: std::sync::Mutex<Option<(u64, Arc<PriceTable>)>>,
    /// Per account, the turn its book's writers in this process take (see the module's
    /// notes). One entry per account this process wrote to.
    books: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When orders take their place in the queue ([`BrokerOrder::priority_at`]) and are
    /// replaced: the system clock until [`PaperBroker::set_clock`] gives the application's.
    clock: std::sync::RwLock<SharedClock>,
}

/// Reference prices by contract symbol.
pub type PriceTable = BTreeMap<String, Price>;

fn account_key(account_id: &str) -> String {
    format!("account:{account_id}")
}

fn order_prefix(account_id: &str) -> String {
    format!("order:{account_id}:")
}

fn order_key(account_id: &str, client_order_id: &str) -> String {
    format!("{}{client_order_id}", order_prefix(account_id))
}

fn decode<T: serde::de::DeserializeOwned + Default>(
    v: Option<serde_json::Value>,
) -> StoreResult<T> {
    match v {
        None => Ok(T::default()),
        Some(v) => decode_doc(v),
    }
}

fn decode_doc<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> StoreResult<T> {
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
}

fn encode<T: Serialize>(v: &T) -> StoreResult<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
}

fn contention(what: &str) -> StoreError {
    StoreError::Unavailable(format!("paper broker {what}: too much contention"))
}

/// The price band: 20 % of the reference, at least 5.00. (A fifth of any decimal is
/// representable, so this cannot overflow; checked all the same.)
fn band(reference: Decimal) -> Decimal {
    reference
        .abs()
        .checked_mul(Decimal::new(2, 1))
        .unwrap_or(Decimal::MAX)
        .max(Decimal::new(5, 0))
}

/// Whether `price` lies within the band around `reference`. A distance too large to
/// represent is outside any band.
fn within_band(price: Price, reference: Price) -> bool {
    price
        .value()
        .checked_sub(reference.value())
        .is_some_and(|d| d.abs() <= band(reference.value()))
}

/// Whether a working order trades at `reference` (stops trigger first), and at what price.
fn crossing(o: &mut BrokerOrder, reference: Price) -> Option<Price> {
    let r = reference.value();
    let buy = o.terms.side == Side::Buy;
    if matches!(o.terms.order_type, OrderType::Stop | OrderType::StopLimit) && !o.triggered {
        let stop = o.terms.stop_price?.value();
        o.triggered = if buy { r >= stop } else { r <= stop };
        if !o.triggered {
            return None;
        }
    }
    match o.terms.order_type {
        OrderType::Market | OrderType::Stop => Some(reference),
        OrderType::Limit | OrderType::StopLimit => {
            let limit = o.terms.limit_price?.value();
            let marketable = if buy { r <= limit } else { r >= limit };
            marketable.then_some(reference)
        }
    }
}

/// Fills what is left of `o` at `price` and moves the account's position. `Err`: the
/// position after the fill cannot be represented; nothing changed.
fn fill(
    positions: &mut BTreeMap<String, BrokerPosition>,
    o: &mut BrokerOrder,
    price: Price,
) -> Result<(), String> {
    let rest = o.terms.quantity.saturating_sub(o.filled_quantity);
    fill_part(positions, o, rest, price)
}

/// Fills `qty` contracts of `o` (at most what is left) at `price` and moves the account's
/// position: `o` is `filled` when nothing is left, else `partially_filled`, and its average
/// fill price is over all its fills. `Err`: the position or the average after the fill
/// cannot be represented; nothing changed.
fn fill_part(
    positions: &mut BTreeMap<String, BrokerPosition>,
    o: &mut BrokerOrder,
    qty: u32,
    price: Price,
) -> Result<(), String> {
    let qty = qty.min(o.terms.quantity.saturating_sub(o.filled_quantity));
    let (q, avg) = match positions.get(&o.terms.symbol) {
        Some(pos) => try_apply_fill(pos.quantity, pos.avg_price, o.terms.side, qty, price),
        None => try_apply_fill(0, None, o.terms.side, qty, price),
    }
    .ok_or_else(|| {
        format!(
            "a fill of {qty} {} at {price} would take the position past what the broker can hold",
            o.terms.symbol
        )
    })?;
    let order_avg = average_after(o.filled_quantity, o.avg_fill_price, qty, price)
        .ok_or_else(|| format!("a fill of {qty} at {price} has no average the broker can hold"))?;
    o.filled_quantity += qty;
    o.status = if o.filled_quantity >= o.terms.quantity {
        BrokerStatus::Filled
    } else {
        BrokerStatus::PartiallyFilled
    };
    o.avg_fill_price = Some(order_avg);
    let pos = positions
        .entry(o.terms.symbol.clone())
        .or_insert(BrokerPosition {
            symbol: o.terms.symbol.clone(),
            quantity: 0,
            avg_price: None,
        });
    pos.quantity = q;
    pos.avg_price = avg;
    Ok(())
}

/// Why the broker refuses prices at the `reference` price (none known, or outside the
/// band), as it checks a new order's and a replace's.
fn price_refusal(o: &BrokerOrder, reference: Option<Price>) -> Result<Price, String> {
    let Some(reference) = reference else {
        return Err(format!("no reference price for {}", o.terms.symbol));
    };
    for p in o.terms.prices() {
        if !within_band(p, reference) {
            return Err(format!(
                "price {p} is outside the broker's band around the reference {reference}"
            ));
        }
    }
    Ok(reference)
}

/// A working order checked against the market at `reference`, as on its arrival: filled if
/// it crosses (which moves `positions`; `true`), cancelled if it is IOC or FOK and cannot
/// fill at once, else still working. `Err`: the fill cannot be held; nothing changed.
fn check_arrival(
    o: &mut BrokerOrder,
    reference: Price,
    positions: &mut BTreeMap<String, BrokerPosition>,
) -> Result<bool, String> {
    match crossing(o, reference) {
        Some(price) => fill(positions, o, price).map(|()| true),
        None => {
            if matches!(o.terms.time_in_force, TimeInForce::Ioc | TimeInForce::Fok) {
                o.status = BrokerStatus::Cancelled;
                o.reason = Some(format!(
                    "{} order could not fill at once",
                    o.terms.time_in_force
                ));
            }
            Ok(false)
        }
    }
}

/// The broker's answer to a new order at the `reference` price, accepted at `now`:
/// rejected (no price, or outside the band), cancelled (IOC or FOK that cannot fill at
/// once), working, or filled, which moves `positions`. `true` if it filled.
fn accept(
    order: &BrokerOrder,
    reference: Option<Price>,
    positions: &mut BTreeMap<String, BrokerPosition>,
    now: Millis,
) -> (BrokerOrder, bool) {
    let mut o = order.clone();
    o.status = BrokerStatus::Working;
    o.filled_quantity = 0;
    o.avg_fill_price = None;
    o.triggered = false;
    o.priority_at = now;
    let reference = match price_refusal(&o, reference) {
        Ok(r) => r,
        Err(why) => {
            o.status = BrokerStatus::Rejected;
            o.reason = Some(why);
            return (o, false);
        }
    };
    match check_arrival(&mut o, reference, positions) {
        Ok(filled) => (o, filled),
        Err(why) => {
            o.status = BrokerStatus::Rejected;
            o.reason = Some(why);
            (o, false)
        }
    }
}

fn order_status_text(s: BrokerStatus) -> &'static str {
    match s {
        BrokerStatus::Working => "working",
        BrokerStatus::PartiallyFilled => "partially filled",
        BrokerStatus::Filled => "filled",
        BrokerStatus::Cancelled => "cancelled",
        BrokerStatus::Rejected => "rejected",
    }
}

/// Why an order of type `t` cannot carry these prices (a limit order needs its limit, a
/// stop order its stop, and neither may carry the other's).
fn prices_refusal(t: OrderType, limit: Option<Price>, stop: Option<Price>) -> Option<String> {
    let needs_limit = matches!(t, OrderType::Limit | OrderType::StopLimit);
    let needs_stop = matches!(t, OrderType::Stop | OrderType::StopLimit);
    if needs_limit != limit.is_some() || needs_stop != stop.is_some() {
        let what = |needed: bool, name: &str| {
            if needed {
                format!("needs a {name} price")
            } else {
                format!("takes no {name} price")
            }
        };
        return Some(format!(
            "a {t} order {} and {}",
            what(needs_limit, "limit"),
            what(needs_stop, "stop")
        ));
    }
    None
}

/// The broker's answer to a replace of `o` by `change` at the `reference` price, at `now`
/// (exchange semantics): `Ok` with the order after the replace, re-checked against the
/// market as a new order is (it may fill, which moves `positions`, or be cancelled as an
/// IOC or FOK that cannot fill at once); `Err` with the reason it is refused, nothing
/// changed. A resend of the order's own version is the order as it is.
fn replace_terms(
    o: &BrokerOrder,
    change: &Replacement,
    reference: Option<Price>,
    positions: &mut BTreeMap<String, BrokerPosition>,
    now: Millis,
) -> Result<BrokerOrder, String> {
    if change.version == o.version && o.version > 1 {
        return Ok(o.clone());
    }
    if change.version <= o.version {
        return Err(format!(
            "stale replace: version {} is not after the order's version {}",
            change.version, o.version
        ));
    }
    if !matches!(
        o.status,
        BrokerStatus::Working | BrokerStatus::PartiallyFilled
    ) {
        return Err(format!(
            "order {} is {}: nothing is left to replace",
            o.client_order_id,
            order_status_text(o.status)
        ));
    }
    if change.quantity == 0 || change.quantity < o.filled_quantity {
        return Err(format!(
            "quantity {} is below the {} already filled (or zero)",
            change.quantity, o.filled_quantity
        ));
    }
    if let Some(why) = prices_refusal(o.terms.order_type, change.limit_price, change.stop_price) {
        return Err(why);
    }
    let mut next = o.clone();
    next.versions.push(BrokerOrderVersion {
        version: o.version,
        quantity: o.terms.quantity,
        limit_price: o.terms.limit_price,
        stop_price: o.terms.stop_price,
        time_in_force: o.terms.time_in_force,
        priority_at: o.priority_at,
        replaced_at: now,
    });
    next.version = change.version;
    next.terms.quantity = change.quantity;
    next.terms.limit_price = change.limit_price;
    next.terms.stop_price = change.stop_price;
    next.terms.time_in_force = change.time_in_force;
    // Time priority: a new price, or more contracts, go to the back of the queue; fewer
    // contracts at the same prices keep their place.
    let repriced = (next.terms.limit_price, next.terms.stop_price)
        != (o.terms.limit_price, o.terms.stop_price);
    if repriced || next.terms.quantity > o.terms.quantity {
        next.priority_at = now;
    }
    let reference = price_refusal(&next, reference)?;
    if next.filled_quantity == next.terms.quantity {
        // Cut to what has filled: nothing is left to trade.
        next.status = BrokerStatus::Filled;
        return Ok(next);
    }
    check_arrival(&mut next, reference, positions)?;
    Ok(next)
}

impl PaperBroker {
    pub fn new(store: Arc<dyn PaperBookStore>) -> Self {
        PaperBroker {
            store,
            prices: std::sync::Mutex::new(None),
            books: Default::default(),
            clock: std::sync::RwLock::new(Arc::new(crate::core::clock::OffsetClock::system())),
        }
    }

    /// Reads time from `clock` (the application's) from now on.
    pub fn set_clock(&self, clock: SharedClock) {
        *self
            .clock
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = clock;
    }

    fn now_ms(&self) -> Millis {
        self.clock
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .now_ms()
    }

    /// Waits for this process's turn to write `account_id`'s book; the turn lasts as long
    /// as the guard.
    async fn book_turn(&self, account_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = self
            .books
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(account_id.to_string())
            .or_default()
            .clone();
        turn.lock_owned().await
    }

    /// The reference price table, as stored now.
    pub async fn prices(&self) -> StoreResult<Arc<PriceTable>> {
        let lock = || {
            self.prices
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let known = lock().clone();
        let version = known.as_ref().map_or(0, |(v, _)| *v);
        match self.store.load_changed(PRICES_KEY, version).await? {
            None => Ok(known.map(|(_, t)| t).unwrap_or_default()),
            Some((doc, version)) => {
                let table: Arc<PriceTable> = Arc::new(decode(doc)?);
                let mut cached = lock();
                // A concurrent reader may have stored a newer table meanwhile; keep that one.
                if cached.as_ref().is_none_or(|(v, _)| *v <= version) {
                    *cached = Some((version, table.clone()));
                }
                Ok(table)
            }
        }
    }

    /// Sets reference prices (seeding, or `airlock prices set`).
    pub async fn set_prices(&self, prices: &BTreeMap<String, Price>) -> StoreResult<()> {
        for round in 0..MAX_ROUNDS {
            pause(round).await;
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
        Err(contention("price table"))
    }

    /// Seeds an account's positions (the broker's view at start).
    pub async fn seed_positions(
        &self,
        account_id: &str,
        positions: &[BrokerPosition],
    ) -> StoreResult<()> {
        let _turn = self.book_turn(account_id).await;
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let (mut book, version) = self.load_book(account_id).await?;
            for p in positions {
                book.positions.insert(p.symbol.clone(), p.clone());
            }
            if self
                .store
                .save(&account_key(account_id), &encode(&book)?, version)
                .await?
            {
                return Ok(());
            }
        }
        Err(contention("book"))
    }

    /// An account's book and its version. A book from before orders had their own
    /// documents is converted first: each of its orders gets its document (an existing one
    /// is newer and kept), then the orders leave the book.
    async fn load_book(&self, account_id: &str) -> StoreResult<(StoredBook, u64)> {
        let key = account_key(account_id);
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let (doc, version) = self.store.load(&key).await?;
            let mut book: StoredBook = decode(doc)?;
            if book.orders.is_empty() {
                return Ok((book, version));
            }
            for o in book.orders.values() {
                let order_key = order_key(account_id, &o.client_order_id);
                self.store.save(&order_key, &encode(o)?, 0).await?;
            }
            book.orders.clear();
            if self.store.save(&key, &encode(&book)?, version).await? {
                return Ok((book, version + 1));
            }
        }
        Err(contention("book"))
    }

    /// An order the broker accepted, and its document's version.
    async fn load_order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<(BrokerOrder, u64)>> {
        let key = order_key(account_id, client_order_id);
        if let (Some(doc), version) = self.store.load(&key).await? {
            return Ok(Some((decode_doc(doc)?, version)));
        }
        // It may still sit in a book from before order documents: convert, look again.
        self.load_book(account_id).await?;
        match self.store.load(&key).await? {
            (Some(doc), version) => Ok(Some((decode_doc(doc)?, version))),
            (None, _) => Ok(None),
        }
    }

    /// An operator's fill: `quantity` contracts of a working (or partly filled) order at
    /// `price`, by default its limit price, else the reference price; it moves the
    /// account's position and leaves the order `partially_filled`, or `filled` when
    /// nothing is left. Refused (the inner `Err`, nothing changed) for an unknown order, one
    /// that is no longer working, a quantity of 0 or more than is left, no price, or a
    /// price worse than the order's limit.
    pub async fn fill(
        &self,
        account_id: &str,
        client_order_id: &str,
        quantity: u32,
        price: Option<Price>,
    ) -> StoreResult<Result<BrokerOrder, String>> {
        let key = order_key(account_id, client_order_id);
        let _turn = self.book_turn(account_id).await;
        let prices = self.prices().await?;
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let Some((mut o, version)) = self.load_order(account_id, client_order_id).await? else {
                return Ok(Err(format!(
                    "the broker has no order {client_order_id} on {account_id}"
                )));
            };
            let id = &o.client_order_id;
            if !matches!(
                o.status,
                BrokerStatus::Working | BrokerStatus::PartiallyFilled
            ) {
                return Ok(Err(format!(
                    "order {id} is {}: it can no longer fill",
                    order_status_text(o.status)
                )));
            }
            let rest = o.terms.quantity - o.filled_quantity.min(o.terms.quantity);
            if quantity == 0 || quantity > rest {
                return Ok(Err(format!(
                    "order {id} has {rest} contract(s) left to fill, not {quantity}"
                )));
            }
            let Some(at) = price
                .or(o.terms.limit_price)
                .or_else(|| prices.get(&o.terms.symbol).copied())
            else {
                return Ok(Err(format!(
                    "no price: order {id} has no limit and {} no reference price",
                    o.terms.symbol
                )));
            };
            if let Some(limit) = o.terms.limit_price {
                let worse = match o.terms.side {
                    Side::Buy => at > limit,
                    Side::Sell => at < limit,
                };
                if worse {
                    return Ok(Err(format!(
                        "a {} limit of {limit} cannot fill at {at}",
                        o.terms.side
                    )));
                }
            }
            let (mut book, book_version) = self.load_book(account_id).await?;
            if let Err(why) = fill_part(&mut book.positions, &mut o, quantity, at) {
                return Ok(Err(why));
            }
            o.triggered |= matches!(o.terms.order_type, OrderType::Stop | OrderType::StopLimit);
            let docs = [
                PaperDoc {
                    key: key.clone(),
                    doc: encode(&o)?,
                    expected_version: version,
                },
                PaperDoc {
                    key: account_key(account_id),
                    doc: encode(&book)?,
                    expected_version: book_version,
                },
            ];
            if self.store.save_all(&docs).await? {
                return Ok(Ok(o));
            }
        }
        Err(contention("order"))
    }

    /// The account as the broker sees it: every order it accepted and its positions.
    /// Lists the account's order documents (a scan on DynamoDB): for the CLI and tests.
    pub async fn book(&self, account_id: &str) -> StoreResult<AccountBook> {
        let (stored, _) = self.load_book(account_id).await?;
        let mut orders = BTreeMap::new();
        for doc in self.store.list(&order_prefix(account_id)).await? {
            let o: BrokerOrder = decode_doc(doc)?;
            if o.terms.account_id == account_id {
                orders.insert(o.client_order_id.clone(), o);
            }
        }
        Ok(AccountBook {
            orders,
            positions: stored.positions,
        })
    }
}

#[async_trait]
impl Prices for PaperBroker {
    async fn reference_price(&self, symbol: &str) -> StoreResult<Option<Price>> {
        Ok(self.prices().await?.get(symbol).copied())
    }
    async fn reference_prices(&self, symbols: &[&str]) -> StoreResult<Vec<Option<Price>>> {
        let prices = self.prices().await?;
        Ok(symbols.iter().map(|s| prices.get(*s).copied()).collect())
    }
}

#[async_trait]
impl Broker for PaperBroker {
    async fn submit(&self, order: &BrokerOrder) -> StoreResult<BrokerOrder> {
        let account = order.terms.account_id.as_str();
        let key = order_key(account, &order.client_order_id);
        // In turn with this process's other writers of the account's book. The price table
        // and the book are read side by side; a later round (another process wrote the
        // book) reads the book again. Loading the book also converts an old one, so every
        // order has its document.
        let _turn = self.book_turn(account).await;
        let (prices, first) = tokio::try_join!(self.prices(), self.load_book(account))?;
        let reference = prices.get(&order.terms.symbol).copied();
        let mut loaded = Some(first);
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let (mut book, version) = match loaded.take() {
                Some(first) => first,
                None => self.load_book(account).await?,
            };
            let (o, filled) = accept(order, reference, &mut book.positions, self.now_ms());
            let mut docs = vec![PaperDoc {
                key: key.clone(),
                doc: encode(&o)?,
                expected_version: 0,
            }];
            if filled {
                docs.push(PaperDoc {
                    key: account_key(account),
                    doc: encode(&book)?,
                    expected_version: version,
                });
            }
            if self.store.save_all(&docs).await? {
                return Ok(o);
            }
            // Nothing was written: the order exists already (a resend of the client order
            // id: the same order, not a new one), or the book moved under us (try again).
            if let (Some(doc), _) = self.store.load(&key).await? {
                return decode_doc(doc);
            }
        }
        Err(contention("book"))
    }

    async fn cancel(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>> {
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let Some((mut o, version)) = self.load_order(account_id, client_order_id).await? else {
                return Ok(None);
            };
            if !matches!(
                o.status,
                BrokerStatus::Working | BrokerStatus::PartiallyFilled
            ) {
                return Ok(Some(o));
            }
            o.status = BrokerStatus::Cancelled;
            o.reason = Some("cancelled on request".into());
            let key = order_key(account_id, client_order_id);
            if self.store.save(&key, &encode(&o)?, version).await? {
                return Ok(Some(o));
            }
        }
        Err(contention("order"))
    }

    async fn replace(
        &self,
        account_id: &str,
        client_order_id: &str,
        change: &Replacement,
    ) -> StoreResult<ReplaceOutcome> {
        let key = order_key(account_id, client_order_id);
        // A replace may fill (a limit moved through the market): in turn with this
        // process's other writers of the account's book.
        let _turn = self.book_turn(account_id).await;
        let prices = self.prices().await?;
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let Some((o, version)) = self.load_order(account_id, client_order_id).await? else {
                return Ok(ReplaceOutcome::Unknown);
            };
            let (mut book, book_version) = self.load_book(account_id).await?;
            let reference = prices.get(&o.terms.symbol).copied();
            let now = self.now_ms();
            let next = match replace_terms(&o, change, reference, &mut book.positions, now) {
                Ok(next) if next == o => return Ok(ReplaceOutcome::Replaced(o)),
                Ok(next) => next,
                Err(reason) => return Ok(ReplaceOutcome::Rejected { order: o, reason }),
            };
            let mut docs = vec![PaperDoc {
                key: key.clone(),
                doc: encode(&next)?,
                expected_version: version,
            }];
            if next.filled_quantity != o.filled_quantity {
                docs.push(PaperDoc {
                    key: account_key(account_id),
                    doc: encode(&book)?,
                    expected_version: book_version,
                });
            }
            if self.store.save_all(&docs).await? {
                return Ok(ReplaceOutcome::Replaced(next));
            }
        }
        Err(contention("order"))
    }

    async fn order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Option<BrokerOrder>> {
        let prices = self.prices().await?;
        let key = order_key(account_id, client_order_id);
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let Some((mut o, version)) = self.load_order(account_id, client_order_id).await? else {
                return Ok(None);
            };
            if !matches!(
                o.status,
                BrokerStatus::Working | BrokerStatus::PartiallyFilled
            ) {
                return Ok(Some(o));
            }
            let Some(reference) = prices.get(&o.terms.symbol).copied() else {
                return Ok(Some(o));
            };
            let before = o.clone();
            let saved = match crossing(&mut o, reference) {
                None if o == before => return Ok(Some(o)),
                // A stop was triggered but its limit does not trade yet.
                None => self.store.save(&key, &encode(&o)?, version).await?,
                Some(price) => {
                    // The fill moves the book: in turn with this process's other writers.
                    let _turn = self.book_turn(account_id).await;
                    let (mut book, book_version) = self.load_book(account_id).await?;
                    if let Err(why) = fill(&mut book.positions, &mut o, price) {
                        // It cannot fill, now or at any price like this one: cancel it
                        // rather than leave it crossing on every check.
                        o.status = BrokerStatus::Cancelled;
                        o.reason = Some(why);
                        let saved = self.store.save(&key, &encode(&o)?, version).await?;
                        if saved {
                            return Ok(Some(o));
                        }
                        continue;
                    }
                    let docs = [
                        PaperDoc {
                            key: key.clone(),
                            doc: encode(&o)?,
                            expected_version: version,
                        },
                        PaperDoc {
                            key: account_key(account_id),
                            doc: encode(&book)?,
                            expected_version: book_version,
                        },
                    ];
                    self.store.save_all(&docs).await?
                }
            };
            if saved {
                return Ok(Some(o));
            }
        }
        Err(contention("order"))
    }

    async fn positions(&self, account_id: &str) -> StoreResult<Vec<BrokerPosition>> {
        Ok(self
            .load_book(account_id)
            .await?
            .0
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
    fn prices_too_far_to_subtract_are_outside_the_band() {
        let extreme = Price::parse("-79228162514264337593543950335").unwrap();
        assert!(!within_band(extreme, p("68.40")));
        assert!(!within_band(p("68.40"), extreme));
        assert!(!within_band(Price::new(Decimal::MAX), extreme));
        assert!(within_band(p("60.00"), p("68.40")));
        assert!(!within_band(p("40.00"), p("68.40")));
        let mut positions = BTreeMap::new();
        let mut o = new_order("o", Side::Buy, OrderType::Limit, None);
        o.terms.limit_price = Some(extreme);
        let (ack, filled) = accept(&o, Some(p("68.40")), &mut positions, 0);
        assert_eq!(ack.status, BrokerStatus::Rejected);
        assert!(!filled);
        assert!(ack.reason.unwrap().contains("band"));
        // The answer, extreme price and all, serializes and reads back.
        let text = serde_json::to_string(&ack.terms.limit_price).unwrap();
        let back: Option<Price> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, Some(extreme));
    }

    #[tokio::test]
    async fn a_fill_the_book_cannot_hold_is_refused_not_a_panic() {
        // At the largest reference price a market order fills; a second one at 68.40
        // averages through the weights (the products would overflow).
        let (_store, broker) = broker_at(&Decimal::MAX.to_string()).await;
        let o = new_order("o-1", Side::Buy, OrderType::Market, None);
        assert_eq!(
            broker.submit(&o).await.unwrap().status,
            BrokerStatus::Filled
        );
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p("68.40"))]))
            .await
            .unwrap();
        let o = new_order("o-2", Side::Buy, OrderType::Market, None);
        assert_eq!(
            broker.submit(&o).await.unwrap().status,
            BrokerStatus::Filled
        );
        let pos = broker.positions("ACC-1").await.unwrap();
        let half = Decimal::MAX / Decimal::from(2);
        assert_eq!(pos[0].quantity, 2);
        assert!((pos[0].avg_price.unwrap().value() - half).abs() < Decimal::from(100));
        // A position the next fill would take past i64: refused, with the reason.
        let (_store, broker) = broker_at("68.40").await;
        let resting = new_order("o-rest", Side::Buy, OrderType::Limit, Some("68.00"));
        assert_eq!(
            broker.submit(&resting).await.unwrap().status,
            BrokerStatus::Working
        );
        let full = BrokerPosition {
            symbol: "CLF27".into(),
            quantity: i64::MAX,
            avg_price: Some(p("68.40")),
        };
        broker
            .seed_positions("ACC-1", std::slice::from_ref(&full))
            .await
            .unwrap();
        let buy = new_order("o-buy", Side::Buy, OrderType::Market, None);
        let ack = broker.submit(&buy).await.unwrap();
        assert_eq!(ack.status, BrokerStatus::Rejected, "{ack:?}");
        assert!(ack
            .reason
            .unwrap()
            .contains("past what the broker can hold"));
        // The resting order crosses later: it cannot fill, so it is cancelled, once.
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p("67.90"))]))
            .await
            .unwrap();
        for _ in 0..2 {
            let o = broker.order("ACC-1", "o-rest").await.unwrap().unwrap();
            assert_eq!(o.status, BrokerStatus::Cancelled, "{o:?}");
        }
        assert_eq!(broker.positions("ACC-1").await.unwrap(), vec![full]);
    }

    #[test]
    fn limits_and_stops_cross_the_reference() {
        let terms = crate::core::domain::OrderTerms {
            account_id: "A".into(),
            symbol: "CLF27".into(),
            side: Side::Buy,
            quantity: 1,
            order_type: OrderType::Limit,
            limit_price: Some(p("68.00")),
            stop_price: None,
            time_in_force: TimeInForce::Day,
        };
        let mut o = BrokerOrder::new("o", &terms, 1);
        assert_eq!(crossing(&mut o, p("68.40")), None);
        assert_eq!(crossing(&mut o, p("67.90")), Some(p("67.90")));
        o.terms.order_type = OrderType::Stop;
        o.terms.stop_price = Some(p("70.00"));
        assert_eq!(crossing(&mut o, p("69.99")), None);
        assert!(!o.triggered);
        assert_eq!(crossing(&mut o, p("70.10")), Some(p("70.10")));
        assert!(o.triggered);
    }

    /// An in-memory [`PaperBookStore`] that records the largest document it was asked to
    /// write and the most documents written at once. With `hop` set, a write first yields
    /// to every other task, as a write that waits on the database does: concurrent
    /// writers all read before any of them writes.
    #[derive(Default)]
    struct MemStore {
        hop: std::sync::atomic::AtomicBool,
        /// Writes refused for a moved version.
        lost: std::sync::atomic::AtomicUsize,
        docs: std::sync::Mutex<BTreeMap<String, (serde_json::Value, u64)>>,
        largest_doc: std::sync::atomic::AtomicUsize,
        most_docs: std::sync::atomic::AtomicUsize,
    }

    impl MemStore {
        fn size(&self, key: &str) -> usize {
            self.docs.lock().unwrap()[key].0.to_string().len()
        }
        fn keys(&self) -> usize {
            self.docs.lock().unwrap().len()
        }
    }

    #[async_trait]
    impl PaperBookStore for MemStore {
        async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)> {
            Ok(match self.docs.lock().unwrap().get(key) {
                Some((d, v)) => (Some(d.clone()), *v),
                None => (None, 0),
            })
        }
        async fn save(&self, key: &str, doc: &serde_json::Value, v: u64) -> StoreResult<bool> {
            self.save_all(&[PaperDoc {
                key: key.into(),
                doc: doc.clone(),
                expected_version: v,
            }])
            .await
        }
        async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool> {
            use std::sync::atomic::Ordering::Relaxed;
            if self.hop.load(Relaxed) {
                tokio::task::yield_now().await;
            }
            let mut all = self.docs.lock().unwrap();
            if docs
                .iter()
                .any(|d| all.get(&d.key).map(|x| x.1).unwrap_or(0) != d.expected_version)
            {
                self.lost.fetch_add(1, Relaxed);
                return Ok(false);
            }
            self.most_docs.fetch_max(docs.len(), Relaxed);
            for d in docs {
                self.largest_doc.fetch_max(d.doc.to_string().len(), Relaxed);
                all.insert(d.key.clone(), (d.doc.clone(), d.expected_version + 1));
            }
            Ok(true)
        }
        async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>> {
            let all = self.docs.lock().unwrap();
            Ok(all
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(_, (d, _))| d.clone())
                .collect())
        }
    }

    fn new_order(id: &str, side: Side, order_type: OrderType, limit: Option<&str>) -> BrokerOrder {
        let terms = crate::core::domain::OrderTerms {
            account_id: "ACC-1".into(),
            symbol: "CLF27".into(),
            side,
            quantity: 1,
            order_type,
            limit_price: limit.map(p),
            stop_price: None,
            time_in_force: TimeInForce::Day,
        };
        BrokerOrder::new(id, &terms, 1)
    }

    async fn broker_at(price: &str) -> (Arc<MemStore>, PaperBroker) {
        let store = Arc::new(MemStore::default());
        let broker = PaperBroker::new(store.clone());
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p(price))]))
            .await
            .unwrap();
        (store, broker)
    }

    /// Forty orders on one account's contracts at once, each write a hop: in turn, every
    /// one fills at its first write. Left to optimistic rounds alone, one writer won per
    /// round and the fortieth would have needed forty: it gave up after sixteen (with the
    /// random pauses alone they all fill, after lost rounds).
    #[tokio::test]
    async fn concurrent_orders_on_one_account_take_turns_on_its_book() {
        let (store, broker) = broker_at("68.40").await;
        let months = ["CLF27", "CLG27", "CLH27", "CLJ27"];
        let prices = months.iter().map(|m| (m.to_string(), p("68.40"))).collect();
        broker.set_prices(&prices).await.unwrap();
        store.hop.store(true, std::sync::atomic::Ordering::Relaxed);
        let broker = Arc::new(broker);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..40 {
            let mut o = new_order(&format!("o-{i}"), Side::Buy, OrderType::Market, None);
            o.terms.symbol = months[i % months.len()].into();
            let broker = broker.clone();
            tasks.spawn(async move { broker.submit(&o).await });
        }
        while let Some(done) = tasks.join_next().await {
            assert_eq!(done.unwrap().unwrap().status, BrokerStatus::Filled);
        }
        let held: Vec<i64> = broker
            .positions("ACC-1")
            .await
            .unwrap()
            .iter()
            .map(|p| p.quantity)
            .collect();
        assert_eq!(held, [10, 10, 10, 10]);
        assert_eq!(
            store.docs.lock().unwrap()["account:ACC-1"].1,
            40,
            "40 writes"
        );
        assert_eq!(
            store.lost.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "no write lost a round"
        );
    }

    /// 5,000 orders on one account: alternating market buys and sells, and every tenth a
    /// limit buy that rests.
    async fn five_thousand_orders(broker: &PaperBroker) {
        for i in 0..5_000 {
            let side = if i % 2 == 0 { Side::Buy } else { Side::Sell };
            let o = if i % 10 == 9 {
                new_order(
                    &format!("o-{i}"),
                    Side::Buy,
                    OrderType::Limit,
                    Some("60.00"),
                )
            } else {
                new_order(&format!("o-{i}"), side, OrderType::Market, None)
            };
            broker.submit(&o).await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_book_stays_small_however_many_orders_an_account_has() {
        let (store, broker) = broker_at("68.40").await;
        five_thousand_orders(&broker).await;
        let book = store.size("account:ACC-1");
        assert!(
            book < 200,
            "the account book is {book} bytes after 5,000 orders"
        );
        let largest = store.largest_doc.load(std::sync::atomic::Ordering::Relaxed);
        assert!(largest < 400, "a {largest}-byte document was written");
        let most = store.most_docs.load(std::sync::atomic::Ordering::Relaxed);
        assert!(most <= 2, "{most} documents written at once");
        // Nothing was lost: every order is there, 500 of them still working.
        let view = broker.book("ACC-1").await.unwrap();
        assert_eq!(view.orders.len(), 5_000);
        let working = view
            .orders
            .values()
            .filter(|o| o.status == BrokerStatus::Working)
            .count();
        assert_eq!(working, 500);
        // 2,500 market buys, 2,000 market sells (every tenth order, a sell, was a limit).
        assert_eq!(view.positions["CLF27"].quantity, 500);
    }

    #[tokio::test]
    async fn a_client_order_id_resent_thousands_of_orders_later_is_not_a_second_order() {
        let (store, broker) = broker_at("68.40").await;
        let first = new_order("o-first", Side::Buy, OrderType::Market, None);
        let ack = broker.submit(&first).await.unwrap();
        assert_eq!(ack.status, BrokerStatus::Filled);
        five_thousand_orders(&broker).await;
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p("70.00"))]))
            .await
            .unwrap();
        let (docs, position) = (store.keys(), broker.positions("ACC-1").await.unwrap());
        // The resend, as a restarted worker would send it (a new broker on the same store).
        let again = PaperBroker::new(store.clone())
            .submit(&first)
            .await
            .unwrap();
        assert_eq!(again, ack, "the same order, filled at the first price");
        assert_eq!(store.keys(), docs, "no new order document");
        assert_eq!(
            broker.positions("ACC-1").await.unwrap(),
            position,
            "no new fill"
        );
        assert_eq!(position[0].quantity, 501);
    }

    #[tokio::test]
    async fn resting_orders_fill_once_when_the_price_crosses_and_cancels_stop_them() {
        let (_store, broker) = broker_at("68.40").await;
        let rest = new_order("o-rest", Side::Buy, OrderType::Limit, Some("68.00"));
        let other = new_order("o-other", Side::Buy, OrderType::Limit, Some("67.00"));
        assert_eq!(
            broker.submit(&rest).await.unwrap().status,
            BrokerStatus::Working
        );
        assert_eq!(
            broker.submit(&other).await.unwrap().status,
            BrokerStatus::Working
        );
        assert!(broker.positions("ACC-1").await.unwrap().is_empty());
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p("67.90"))]))
            .await
            .unwrap();
        for _ in 0..2 {
            let o = broker.order("ACC-1", "o-rest").await.unwrap().unwrap();
            assert_eq!(o.status, BrokerStatus::Filled);
            assert_eq!(o.avg_fill_price, Some(p("67.90")));
        }
        let pos = broker.positions("ACC-1").await.unwrap();
        assert_eq!((pos[0].quantity, pos[0].avg_price), (1, Some(p("67.90"))));
        let c = broker.cancel("ACC-1", "o-other").await.unwrap().unwrap();
        assert_eq!(c.status, BrokerStatus::Cancelled);
        let filled = broker.cancel("ACC-1", "o-rest").await.unwrap().unwrap();
        assert_eq!(
            filled.status,
            BrokerStatus::Filled,
            "a filled order stays filled"
        );
        assert_eq!(broker.cancel("ACC-1", "o-unknown").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_book_from_before_order_documents_is_converted_and_still_deduplicates() {
        let (store, broker) = broker_at("68.40").await;
        let mut old = new_order("o-old", Side::Buy, OrderType::Market, None);
        old.status = BrokerStatus::Filled;
        old.filled_quantity = 1;
        old.avg_fill_price = Some(p("60.00"));
        let legacy = serde_json::json!({
            "orders": { "o-old": old },
            "positions": { "CLF27": { "symbol": "CLF27", "quantity": 1, "avg_price": "60.00" } },
        });
        assert!(store.save("account:ACC-1", &legacy, 0).await.unwrap());
        let again = broker
            .submit(&new_order("o-old", Side::Buy, OrderType::Market, None))
            .await
            .unwrap();
        assert_eq!(again, old, "the order the old book held, not a new one");
        assert_eq!(broker.positions("ACC-1").await.unwrap()[0].quantity, 1);
        let doc = store.load("account:ACC-1").await.unwrap().0.unwrap();
        assert!(
            doc.get("orders").is_none(),
            "the orders left the book: {doc}"
        );
        assert_eq!(broker.book("ACC-1").await.unwrap().orders["o-old"], old);
    }

    use crate::core::clock::Clock;

    /// A clock the test moves.
    struct StepClock(std::sync::atomic::AtomicI64);

    impl Clock for StepClock {
        fn now_ms(&self) -> Millis {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    async fn clocked_broker_at(price: &str) -> (Arc<StepClock>, PaperBroker) {
        let (_store, broker) = broker_at(price).await;
        let clock = Arc::new(StepClock(std::sync::atomic::AtomicI64::new(1_000)));
        broker.set_clock(clock.clone());
        (clock, broker)
    }

    fn later(clock: &StepClock, ms: i64) -> Millis {
        clock.0.fetch_add(ms, std::sync::atomic::Ordering::Relaxed) + ms
    }

    fn change(version: u32, quantity: u32, limit: &str) -> Replacement {
        Replacement {
            version,
            quantity,
            limit_price: Some(p(limit)),
            stop_price: None,
            time_in_force: TimeInForce::Day,
        }
    }

    async fn resting_buy(broker: &PaperBroker, id: &str, quantity: u32) -> BrokerOrder {
        let mut o = new_order(id, Side::Buy, OrderType::Limit, Some("68.00"));
        o.terms.quantity = quantity;
        let ack = broker.submit(&o).await.unwrap();
        assert_eq!(ack.status, BrokerStatus::Working, "{ack:?}");
        ack
    }

    fn replaced(outcome: ReplaceOutcome) -> BrokerOrder {
        match outcome {
            ReplaceOutcome::Replaced(o) => o,
            other => panic!("not replaced: {other:?}"),
        }
    }

    fn refused(outcome: ReplaceOutcome) -> (BrokerOrder, String) {
        match outcome {
            ReplaceOutcome::Rejected { order, reason } => (order, reason),
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_replace_keeps_its_place_only_when_it_takes_contracts_away() {
        let (clock, broker) = clocked_broker_at("68.40").await;
        let first = resting_buy(&broker, "o-r", 5).await;
        assert_eq!((first.version, first.priority_at), (1, 1_000));
        // Fewer contracts at the same price: the same place in the queue.
        let at = later(&clock, 10);
        let down = replaced(
            broker
                .replace("ACC-1", "o-r", &change(2, 3, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!((down.version, down.terms.quantity), (2, 3));
        assert_eq!(down.priority_at, 1_000, "a pure reduction keeps priority");
        assert_eq!(down.versions.len(), 1);
        assert_eq!(
            (down.versions[0].version, down.versions[0].quantity),
            (1, 5)
        );
        assert_eq!(down.versions[0].replaced_at, at);
        // More contracts: the back of the queue.
        let at = later(&clock, 10);
        let up = replaced(
            broker
                .replace("ACC-1", "o-r", &change(3, 4, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!(up.priority_at, at, "an increase loses priority");
        // A new price: the back of the queue too; the history shows every version.
        let at = later(&clock, 10);
        let moved = replaced(
            broker
                .replace("ACC-1", "o-r", &change(4, 4, "67.95"))
                .await
                .unwrap(),
        );
        assert_eq!(moved.priority_at, at, "a price change loses priority");
        assert_eq!(moved.terms.limit_price, Some(p("67.95")));
        let history: Vec<(u32, u32, Millis)> = moved
            .versions
            .iter()
            .map(|v| (v.version, v.quantity, v.priority_at))
            .collect();
        assert_eq!(history, [(1, 5, 1_000), (2, 3, 1_000), (3, 4, at - 10)]);
        // What the broker stores is what it answered.
        assert_eq!(
            broker.order("ACC-1", "o-r").await.unwrap(),
            Some(moved.clone())
        );
        // A resend of the same version: the order as it is, nothing applied twice.
        later(&clock, 10);
        let again = replaced(
            broker
                .replace("ACC-1", "o-r", &change(4, 9, "60.00"))
                .await
                .unwrap(),
        );
        assert_eq!(again, moved);
        // An older version: stale.
        let (order, why) = refused(
            broker
                .replace("ACC-1", "o-r", &change(3, 1, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!(order, moved);
        assert!(why.contains("stale"), "{why}");
        // An order the broker does not know.
        assert_eq!(
            broker
                .replace("ACC-1", "o-none", &change(2, 1, "68.00"))
                .await
                .unwrap(),
            ReplaceOutcome::Unknown
        );
    }

    #[tokio::test]
    async fn a_replace_of_a_partly_filled_order_applies_to_the_rest() {
        let (_clock, broker) = clocked_broker_at("68.40").await;
        resting_buy(&broker, "o-p", 5).await;
        let part = broker.fill("ACC-1", "o-p", 2, None).await.unwrap().unwrap();
        assert_eq!(
            (part.status, part.filled_quantity, part.avg_fill_price),
            (BrokerStatus::PartiallyFilled, 2, Some(p("68.00")))
        );
        assert_eq!(broker.positions("ACC-1").await.unwrap()[0].quantity, 2);
        // Below what filled: refused, nothing changed.
        let (order, why) = refused(
            broker
                .replace("ACC-1", "o-p", &change(2, 1, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!(order, part);
        assert!(why.contains("below the 2 already filled"), "{why}");
        // Four in all: two left to trade.
        let four = replaced(
            broker
                .replace("ACC-1", "o-p", &change(2, 4, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!(
            (four.status, four.terms.quantity, four.filled_quantity),
            (BrokerStatus::PartiallyFilled, 4, 2)
        );
        // A fill of the rest at another price: the average is over both fills.
        let done = broker
            .fill("ACC-1", "o-p", 2, Some(p("67.50")))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (done.status, done.filled_quantity, done.avg_fill_price),
            (BrokerStatus::Filled, 4, Some(p("67.75")))
        );
        let pos = broker.positions("ACC-1").await.unwrap();
        assert_eq!((pos[0].quantity, pos[0].avg_price), (4, Some(p("67.75"))));
        // Filled: a replace is refused with the reason.
        let (_, why) = refused(
            broker
                .replace("ACC-1", "o-p", &change(3, 6, "68.00"))
                .await
                .unwrap(),
        );
        assert!(why.contains("is filled"), "{why}");
        // Cut to what filled: nothing left, the order is filled.
        resting_buy(&broker, "o-cut", 3).await;
        broker
            .fill("ACC-1", "o-cut", 1, None)
            .await
            .unwrap()
            .unwrap();
        let cut = replaced(
            broker
                .replace("ACC-1", "o-cut", &change(2, 1, "68.00"))
                .await
                .unwrap(),
        );
        assert_eq!((cut.status, cut.filled_quantity), (BrokerStatus::Filled, 1));
        // Cancelled: refused too.
        resting_buy(&broker, "o-c", 1).await;
        broker.cancel("ACC-1", "o-c").await.unwrap();
        let (_, why) = refused(
            broker
                .replace("ACC-1", "o-c", &change(2, 2, "68.00"))
                .await
                .unwrap(),
        );
        assert!(why.contains("is cancelled"), "{why}");
    }

    #[tokio::test]
    async fn a_replaced_order_is_checked_as_a_new_order_is() {
        let (_clock, broker) = clocked_broker_at("68.40").await;
        resting_buy(&broker, "o-b", 2).await;
        // Outside the band (20 % of 68.40, at least 5.00): refused, the order unchanged.
        let (order, why) = refused(
            broker
                .replace("ACC-1", "o-b", &change(2, 2, "40.00"))
                .await
                .unwrap(),
        );
        assert_eq!(
            (order.version, order.terms.limit_price),
            (1, Some(p("68.00")))
        );
        assert!(why.contains("band"), "{why}");
        // A price the order type cannot carry.
        let mut stop = change(2, 2, "68.00");
        stop.stop_price = Some(p("69.00"));
        let (_, why) = refused(broker.replace("ACC-1", "o-b", &stop).await.unwrap());
        assert!(why.contains("takes no stop price"), "{why}");
        // A limit moved through the market fills at the reference, and moves the position.
        let filled = replaced(
            broker
                .replace("ACC-1", "o-b", &change(2, 2, "68.50"))
                .await
                .unwrap(),
        );
        assert_eq!(
            (filled.status, filled.filled_quantity, filled.avg_fill_price),
            (BrokerStatus::Filled, 2, Some(p("68.40")))
        );
        assert_eq!(broker.positions("ACC-1").await.unwrap()[0].quantity, 2);
        // Made IOC where it cannot fill: cancelled, as a new IOC order would be.
        resting_buy(&broker, "o-i", 1).await;
        let mut ioc = change(2, 1, "68.00");
        ioc.time_in_force = TimeInForce::Ioc;
        let gone = replaced(broker.replace("ACC-1", "o-i", &ioc).await.unwrap());
        assert_eq!(gone.status, BrokerStatus::Cancelled);
        assert!(gone.reason.unwrap().contains("could not fill at once"));
    }

    #[tokio::test]
    async fn an_operators_fill_is_refused_for_what_cannot_fill() {
        let (_clock, broker) = clocked_broker_at("68.40").await;
        resting_buy(&broker, "o-f", 3).await;
        let refusal = |r: StoreResult<Result<BrokerOrder, String>>| r.unwrap().unwrap_err();
        assert!(refusal(broker.fill("ACC-1", "o-none", 1, None).await).contains("no order o-none"));
        assert!(refusal(broker.fill("ACC-1", "o-f", 4, None).await).contains("3 contract(s) left"));
        assert!(refusal(broker.fill("ACC-1", "o-f", 0, None).await).contains("not 0"));
        let worse = refusal(broker.fill("ACC-1", "o-f", 1, Some(p("68.10"))).await);
        assert!(worse.contains("cannot fill at 68.10"), "{worse}");
        assert!(
            broker.positions("ACC-1").await.unwrap().is_empty(),
            "nothing moved"
        );
        broker.fill("ACC-1", "o-f", 3, None).await.unwrap().unwrap();
        let closed = refusal(broker.fill("ACC-1", "o-f", 1, None).await);
        assert!(closed.contains("is filled"), "{closed}");
        // A partly filled order's rest crosses later: the rest fills, the average holds both.
        resting_buy(&broker, "o-x", 2).await;
        broker
            .fill("ACC-1", "o-x", 1, Some(p("67.00")))
            .await
            .unwrap()
            .unwrap();
        broker
            .set_prices(&BTreeMap::from([("CLF27".to_string(), p("67.90"))]))
            .await
            .unwrap();
        let o = broker.order("ACC-1", "o-x").await.unwrap().unwrap();
        assert_eq!(
            (o.status, o.filled_quantity, o.avg_fill_price),
            (BrokerStatus::Filled, 2, Some(p("67.45")))
        );
    }
}
