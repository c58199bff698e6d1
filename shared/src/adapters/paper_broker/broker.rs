//! The [`Broker`] port: submit, cancel, replace, an order's state (which fills it when
//! the reference price crosses it), and positions.

use async_trait::async_trait;

use super::documents::{
    book_doc, contention, decode_doc, encode, order_doc, order_key, pause, MAX_ROUNDS,
};
use super::matching::{accept, crossing, fill, replace_terms};
use super::PaperBroker;
use crate::core::error::StoreResult;
use crate::core::ports::broker::{
    Broker, BrokerOrder, BrokerPosition, BrokerStatus, ReplaceOutcome, Replacement,
};

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
        let reference = super::price_in(&prices, &order.terms.symbol);
        let mut loaded = Some(first);
        for round in 0..MAX_ROUNDS {
            pause(round).await;
            let (mut book, version) = match loaded.take() {
                Some(first) => first,
                None => self.load_book(account).await?,
            };
            let (o, filled) = accept(order, reference, &mut book.positions, self.now_ms());
            let mut docs = vec![order_doc(&key, &o, 0)?];
            if filled {
                docs.push(book_doc(account, &book, version)?);
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
            let (mut o, version) = match self.load_open_order(account_id, client_order_id).await? {
                Ok(open) => open,
                Err(answer) => return Ok(answer),
            };
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
            let reference = super::price_in(&prices, &o.terms.symbol);
            let now = self.now_ms();
            let next = match replace_terms(&o, change, reference, &mut book.positions, now) {
                Ok(next) if next == o => return Ok(ReplaceOutcome::Replaced(o)),
                Ok(next) => next,
                Err(reason) => return Ok(ReplaceOutcome::Rejected { order: o, reason }),
            };
            let mut docs = vec![order_doc(&key, &next, version)?];
            if next.filled_quantity != o.filled_quantity {
                docs.push(book_doc(account_id, &book, book_version)?);
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
            let (mut o, version) = match self.load_open_order(account_id, client_order_id).await? {
                Ok(open) => open,
                Err(answer) => return Ok(answer),
            };
            let Some(reference) = super::price_in(&prices, &o.terms.symbol) else {
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
                        order_doc(&key, &o, version)?,
                        book_doc(account_id, &book, book_version)?,
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
