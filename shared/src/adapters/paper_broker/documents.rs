//! The broker's documents in its [`PaperBookStore`]: their keys and encoding, an account's
//! book as stored (and its conversion from the layout that kept orders inside it), and the
//! pause between rounds of an optimistic write that lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::PaperBroker;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::broker::{BrokerOrder, BrokerPosition, BrokerStatus};
use crate::core::ports::PaperDoc;

pub(super) const MAX_ROUNDS: usize = 16;

/// Before round `round` of a read-and-write that lost the one before (another process wrote
/// the document in between): a random pause of up to 2^round ms, 64 ms at most, so that
/// contenders spread out instead of colliding again at once. None before the first round.
pub(super) async fn pause(round: usize) {
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
pub(super) struct StoredBook {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) orders: BTreeMap<String, BrokerOrder>,
    #[serde(default)]
    pub(super) positions: BTreeMap<String, BrokerPosition>,
}

pub(super) fn account_key(account_id: &str) -> String {
    format!("account:{account_id}")
}

pub(super) fn order_prefix(account_id: &str) -> String {
    format!("order:{account_id}:")
}

pub(super) fn order_key(account_id: &str, client_order_id: &str) -> String {
    format!("{}{client_order_id}", order_prefix(account_id))
}

pub(super) fn decode<T: serde::de::DeserializeOwned + Default>(
    v: Option<serde_json::Value>,
) -> StoreResult<T> {
    match v {
        None => Ok(T::default()),
        Some(v) => decode_doc(v),
    }
}

pub(super) fn decode_doc<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> StoreResult<T> {
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
}

pub(super) fn encode<T: Serialize>(v: &T) -> StoreResult<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))
}

pub(super) fn contention(what: &str) -> StoreError {
    StoreError::Unavailable(format!("paper broker {what}: too much contention"))
}

/// An order's document, written over `version` (0: created, only if absent).
pub(super) fn order_doc(key: &str, o: &BrokerOrder, version: u64) -> StoreResult<PaperDoc> {
    Ok(PaperDoc {
        key: key.to_string(),
        doc: encode(o)?,
        expected_version: version,
    })
}

/// An account's book document, written over `version`.
pub(super) fn book_doc(account_id: &str, book: &StoredBook, version: u64) -> StoreResult<PaperDoc> {
    Ok(PaperDoc {
        key: account_key(account_id),
        doc: encode(book)?,
        expected_version: version,
    })
}

impl PaperBroker {
    /// An account's book and its version. A book from before orders had their own
    /// documents is converted first: each of its orders gets its document (an existing one
    /// is newer and kept), then the orders leave the book.
    pub(super) async fn load_book(&self, account_id: &str) -> StoreResult<(StoredBook, u64)> {
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
    pub(super) async fn load_order(
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

    /// An order still open (working or partly filled) and its document's version; or,
    /// as `Err`, the answer for an order there is nothing more to do to: `None` for an
    /// unknown one, a finished one as it stands.
    pub(super) async fn load_open_order(
        &self,
        account_id: &str,
        client_order_id: &str,
    ) -> StoreResult<Result<(BrokerOrder, u64), Option<BrokerOrder>>> {
        Ok(match self.load_order(account_id, client_order_id).await? {
            None => Err(None),
            Some((o, _))
                if !matches!(
                    o.status,
                    BrokerStatus::Working | BrokerStatus::PartiallyFilled
                ) =>
            {
                Err(Some(o))
            }
            Some(open) => Ok(open),
        })
    }
}
