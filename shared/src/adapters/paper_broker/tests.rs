use rust_decimal::Decimal;

use super::*;
use crate::core::domain::TimeInForce;
use crate::core::ports::broker::{Broker, ReplaceOutcome, Replacement};
use crate::core::ports::PaperDoc;

pub(super) fn p(s: &str) -> Price {
    Price::parse(s).unwrap()
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

pub(super) fn new_order(
    id: &str,
    side: Side,
    order_type: OrderType,
    limit: Option<&str>,
) -> BrokerOrder {
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

#[tokio::test]
async fn a_price_carries_the_time_it_was_set_and_an_old_table_reads_as_of_unknown_age() {
    let store = Arc::new(MemStore::default());
    // A table written before prices carried their time: the price alone.
    let old = serde_json::json!({ "CLF27": "68.40" });
    assert!(store.save(PRICES_KEY, &old, 0).await.unwrap());
    let broker = PaperBroker::new(store.clone());
    let clock = Arc::new(StepClock(std::sync::atomic::AtomicI64::new(5_000)));
    broker.set_clock(clock.clone());
    let q = broker.quote("CLF27").await.unwrap().unwrap();
    assert_eq!((q.price, q.observed_at), (p("68.40"), None));
    // Set again, it is stamped with the broker's clock; the other prices keep theirs.
    let at = later(&clock, 7_000);
    broker
        .set_prices(&BTreeMap::from([("CLG27".to_string(), p("68.10"))]))
        .await
        .unwrap();
    let g = broker.quote("CLG27").await.unwrap().unwrap();
    assert_eq!((g.price, g.observed_at), (p("68.10"), Some(at)));
    assert_eq!(
        broker.quote("CLF27").await.unwrap().unwrap().observed_at,
        None
    );
    assert_eq!(
        broker.reference_price("CLG27").await.unwrap(),
        Some(p("68.10"))
    );
    assert_eq!(broker.quote("CLH27").await.unwrap(), None);
}
