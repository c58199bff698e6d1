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
//!
//! [`matching`] is the exchange's side (crossing, fills, the price band, replaces),
//! [`documents`] the documents and the rounds of optimistic writes, [`broker`] the
//! [`Broker`](crate::core::ports::broker::Broker) port.

mod broker;
mod documents;
mod matching;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::core::clock::SharedClock;
use crate::core::domain::{Millis, OrderType, Price, Side};
use crate::core::error::StoreResult;
use crate::core::ports::broker::{BrokerOrder, BrokerPosition, BrokerStatus};
use crate::core::ports::{PaperBookStore, Prices, Quote};

use documents::{
    account_key, book_doc, contention, decode, decode_doc, encode, order_doc, order_key,
    order_prefix, pause, MAX_ROUNDS,
};
use matching::{fill_part, order_status_text};

pub const PRICES_KEY: &str = "prices";

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

/// Reference prices by contract symbol, each with the time it was set.
pub type PriceTable = BTreeMap<String, Quote>;

/// A price as the table stores it: with the time it was set, or (written before prices
/// carried their time) the price alone.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredQuote {
    Timed { price: Price, observed_at: Millis },
    Plain(Price),
}

fn decode_prices(doc: Option<serde_json::Value>) -> StoreResult<PriceTable> {
    let stored: BTreeMap<String, StoredQuote> = decode(doc)?;
    Ok(stored
        .into_iter()
        .map(|(symbol, q)| {
            let quote = match q {
                StoredQuote::Timed { price, observed_at } => Quote {
                    price,
                    observed_at: Some(observed_at),
                },
                StoredQuote::Plain(price) => Quote {
                    price,
                    observed_at: None,
                },
            };
            (symbol, quote)
        })
        .collect())
}

/// The price of `symbol` in the table, without its time.
pub(super) fn price_in(table: &PriceTable, symbol: &str) -> Option<Price> {
    table.get(symbol).map(|q| q.price)
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
                let table: Arc<PriceTable> = Arc::new(decode_prices(doc)?);
                let mut cached = lock();
                // A concurrent reader may have stored a newer table meanwhile; keep that one.
                if cached.as_ref().is_none_or(|(v, _)| *v <= version) {
                    *cached = Some((version, table.clone()));
                }
                Ok(table)
            }
        }
    }

    /// Sets reference prices (seeding, or `airlock prices set`), observed now.
    pub async fn set_prices(&self, prices: &BTreeMap<String, Price>) -> StoreResult<()> {
        let observed_at = self.now_ms();
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let (doc, version) = self.store.load(PRICES_KEY).await?;
            let mut table: BTreeMap<String, StoredQuote> = decode(doc)?;
            table.extend(prices.iter().map(|(k, v)| {
                (
                    k.clone(),
                    StoredQuote::Timed {
                        price: *v,
                        observed_at,
                    },
                )
            }));
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
                .or_else(|| price_in(&prices, &o.terms.symbol))
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
                order_doc(&key, &o, version)?,
                book_doc(account_id, &book, book_version)?,
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
    async fn quote(&self, symbol: &str) -> StoreResult<Option<Quote>> {
        Ok(self.prices().await?.get(symbol).copied())
    }
    async fn quotes(&self, symbols: &[&str]) -> StoreResult<Vec<Option<Quote>>> {
        let prices = self.prices().await?;
        Ok(symbols.iter().map(|s| prices.get(*s).copied()).collect())
    }
    async fn reference_prices(&self, symbols: &[&str]) -> StoreResult<Vec<Option<Price>>> {
        let prices = self.prices().await?;
        Ok(symbols.iter().map(|s| price_in(&prices, s)).collect())
    }
}

#[cfg(test)]
mod tests;
