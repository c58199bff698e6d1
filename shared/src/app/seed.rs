//! Demo data, loaded on the first start of `airlock serve` (embedded) or by
//! `airlock bootstrap --demo-data`. See the README for the demo operators.
//!
//! Contracts are chosen relative to "now" (the front CL contract with more than a week to
//! its last trading day, and the two after it), so the demo stays tradable whenever it runs.

use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::{
    Account, AccountStatus, Exposure, Job, JobKind, JobStatus, Millis, Order, OrderStatus,
    OrderType, Position, Price, Side, TimeInForce,
};
use crate::core::error::StoreResult;
use crate::core::ports::ReadModelWriter;

/// A demo operator: `airlock token operator --sub <sub> --roles <roles> [--desks <desks>]`.
pub struct DemoOperator {
    pub sub: &'static str,
    pub roles: &'static [&'static str],
    pub desks: &'static [&'static str],
    pub who: &'static str,
}

pub const DEMO_OPERATORS: &[DemoOperator] = &[
    DemoOperator {
        sub: "op-energy-trader",
        roles: &["trader"],
        desks: &["energy"],
        who: "energy trader: reads, plans and executes on the energy desk",
    },
    DemoOperator {
        sub: "op-viewer",
        roles: &["viewer"],
        desks: &["energy"],
        who: "viewer: reads the energy desk, cannot plan or execute",
    },
    DemoOperator {
        sub: "op-head-trader",
        roles: &["head_trader"],
        desks: &[],
        who: "head trader: every desk, plans and executes",
    },
];

/// The next three tradable CL contracts at `now`.
pub fn demo_contracts(now: Millis) -> [ClContract; 3] {
    let cal = ExchangeCalendar::cme();
    let t = chrono::DateTime::from_timestamp_millis(now).unwrap_or_default();
    let horizon = t + chrono::Duration::days(7);
    let mut found = Vec::new();
    let mut y = chrono::Datelike::year(&t);
    let mut m = chrono::Datelike::month(&t);
    while found.len() < 3 {
        let sym = format!(
            "CL{}{:02}",
            b"FGHJKMNQUVXZ"[(m - 1) as usize] as char,
            y % 100
        );
        if let Ok(c) = ClContract::parse(&sym) {
            if c.trading_stops_at(cal) > horizon {
                found.push(c);
            }
        }
        m += 1;
        if m > 12 {
            m = 1;
            y += 1;
        }
    }
    [found[0], found[1], found[2]]
}

fn p(s: &str) -> Option<Price> {
    Price::parse(s).ok()
}

/// Reference prices for every listed CL contract: 68.40 for the front month, 0.12 lower
/// for each month after it (a mild backwardation), never below 55.00.
pub fn demo_prices(now: Millis) -> std::collections::BTreeMap<String, Price> {
    let cal = ExchangeCalendar::cme();
    let today = chrono::DateTime::from_timestamp_millis(now)
        .unwrap_or_default()
        .date_naive();
    let mut out = std::collections::BTreeMap::new();
    let (Some(mut c), Some(last)) = (
        ClContract::front_month(today, cal),
        ClContract::last_listed(today),
    ) else {
        return out;
    };
    let mut i = 0i64;
    while c <= last {
        let price = (rust_decimal::Decimal::new(6840, 2)
            - rust_decimal::Decimal::new(12, 2) * rust_decimal::Decimal::from(i))
        .max(rust_decimal::Decimal::new(5500, 2));
        out.insert(c.symbol(), Price::new(price));
        i += 1;
        match c.next() {
            Some(n) => c = n,
            None => break,
        }
    }
    out
}

/// The demo data and the paper broker's matching state: reference prices, and the broker's
/// view of the demo positions (one account off by a missed fill, for `positions.sync`).
pub async fn load_demo_all(ports: &crate::app::Ports, now: Millis) -> StoreResult<()> {
    load_demo(ports.read_models.as_ref(), now).await?;
    ports.paper.set_prices(&demo_prices(now)).await?;
    let [c1, c2, c3] = demo_contracts(now).map(|c| c.symbol());
    let bp = |s: &str, q: i64, px: &str| crate::core::ports::broker::BrokerPosition {
        symbol: s.to_string(),
        quantity: q,
        avg_price: p(px),
    };
    ports
        .paper
        .seed_positions("ACC-1", &[bp(&c1, 3, "68.40"), bp(&c2, -2, "67.95")])
        .await?;
    // The broker saw 2 more contracts filled for ACC-2 (ORD-1004's partial fill).
    ports
        .paper
        .seed_positions("ACC-2", &[bp(&c1, 12, "70.18")])
        .await?;
    ports
        .paper
        .seed_positions("ACC-3", &[bp(&c3, 5, "66.10")])
        .await?;
    Ok(())
}

pub async fn load_demo(w: &dyn ReadModelWriter, now: Millis) -> StoreResult<()> {
    let acc = |id: &str, name: &str, desk: &str, status| Account {
        account_id: id.into(),
        name: name.into(),
        desk: desk.into(),
        currency: "USD".into(),
        status,
    };
    w.put_accounts(&[
        acc("ACC-1", "Energy Alpha", "energy", AccountStatus::Active),
        acc("ACC-2", "Energy Beta", "energy", AccountStatus::Active),
        acc("ACC-3", "Metals Macro", "metals", AccountStatus::Active),
        acc("ACC-4", "Energy Legacy", "energy", AccountStatus::Suspended),
    ])
    .await?;

    let [c1, c2, c3] = demo_contracts(now).map(|c| c.symbol());
    let pos = |a: &str, s: &str, q: i64, px: &str| Position {
        account_id: a.into(),
        symbol: s.into(),
        quantity: q,
        avg_price: p(px),
        updated_at: now - 3_600_000,
        day_realized: None,
    };
    let positions = [
        pos("ACC-1", &c1, 3, "68.40"),
        pos("ACC-1", &c2, -2, "67.95"),
        pos("ACC-2", &c1, 10, "70.12"),
        pos("ACC-3", &c3, 5, "66.10"),
    ];
    w.put_positions(&positions).await?;

    let minute = 60_000;
    let order =
        |id: &str, a: &str, s: &str, side, q, t, lp: &str, st, filled, fill: &str, ago: i64| {
            Order {
                order_id: id.into(),
                terms: crate::core::domain::OrderTerms {
                    account_id: a.into(),
                    symbol: s.to_string(),
                    side,
                    quantity: q,
                    order_type: t,
                    limit_price: p(lp),
                    stop_price: None,
                    time_in_force: TimeInForce::Day,
                },
                status: st,
                filled_quantity: filled,
                avg_fill_price: p(fill),
                action_id: None,
                created_at: now - ago * minute,
                updated_at: now - ago * minute + minute,
                version: 1,
                versions: Vec::new(),
            }
        };
    use OrderStatus::*;
    let orders = [
        order(
            "ORD-1001",
            "ACC-1",
            &c1,
            Side::Buy,
            3,
            OrderType::Market,
            "",
            Filled,
            3,
            "68.40",
            300,
        ),
        order(
            "ORD-1002",
            "ACC-1",
            &c2,
            Side::Sell,
            2,
            OrderType::Limit,
            "67.95",
            Filled,
            2,
            "67.95",
            240,
        ),
        order(
            "ORD-1003",
            "ACC-1",
            &c1,
            Side::Buy,
            1,
            OrderType::Limit,
            "60.00",
            Working,
            0,
            "",
            120,
        ),
        order(
            "ORD-1004",
            "ACC-2",
            &c1,
            Side::Buy,
            5,
            OrderType::Limit,
            "70.50",
            PartiallyFilled,
            2,
            "70.48",
            90,
        ),
        order(
            "ORD-1005",
            "ACC-2",
            &c2,
            Side::Sell,
            4,
            OrderType::Limit,
            "75.00",
            Cancelled,
            0,
            "",
            60,
        ),
        order(
            "ORD-1006",
            "ACC-1",
            &c1,
            Side::Buy,
            2,
            OrderType::Limit,
            "20.00",
            Rejected,
            0,
            "",
            45,
        ),
        order(
            "ORD-1007",
            "ACC-3",
            &c3,
            Side::Buy,
            5,
            OrderType::Market,
            "",
            Filled,
            5,
            "66.10",
            30,
        ),
    ];
    w.put_orders(&orders).await?;
    w.put_exposures(&exposures_of(&positions, &orders)).await?;

    w.put_jobs(&[
        Job {
            job_id: "JOB-2001".into(),
            kind: JobKind::PositionsSync,
            status: JobStatus::Succeeded,
            account_id: Some("ACC-1".into()),
            action_id: None,
            created_at: now - 200 * minute,
            updated_at: now - 199 * minute,
            error: None,
            result: None,
        },
        Job {
            job_id: "JOB-2002".into(),
            kind: JobKind::PositionsSync,
            status: JobStatus::Failed,
            account_id: Some("ACC-2".into()),
            action_id: None,
            created_at: now - 100 * minute,
            updated_at: now - 99 * minute,
            error: Some("broker session timed out after 30 s; no positions were changed".into()),
            result: None,
        },
    ])
    .await?;
    Ok(())
}

/// The exposures of seeded positions and open orders, per account and contract.
fn exposures_of(positions: &[Position], orders: &[Order]) -> Vec<(String, String, Exposure)> {
    let mut out: std::collections::BTreeMap<(String, String), Exposure> = Default::default();
    for p in positions {
        out.entry((p.account_id.clone(), p.symbol.clone()))
            .or_default()
            .position = p.quantity;
    }
    for o in orders.iter().filter(|o| o.open_quantity() > 0) {
        let e = out
            .entry((o.terms.account_id.clone(), o.terms.symbol.clone()))
            .or_default();
        match o.terms.side {
            Side::Buy => e.open_buy += o.open_quantity(),
            Side::Sell => e.open_sell += o.open_quantity(),
        }
    }
    out.into_iter().map(|((a, s), e)| (a, s, e)).collect()
}

/// `n` extra filled orders spread over the demo accounts, for benchmarks.
pub async fn load_bulk_orders(w: &dyn ReadModelWriter, now: Millis, n: usize) -> StoreResult<()> {
    let [c1, c2, _] = demo_contracts(now).map(|c| c.symbol());
    let accounts = ["ACC-1", "ACC-2", "ACC-3"];
    let mut batch = Vec::with_capacity(1000);
    for i in 0..n {
        batch.push(Order {
            order_id: format!("BULK-{i:07}"),
            terms: crate::core::domain::OrderTerms {
                account_id: accounts[i % 3].into(),
                symbol: if i % 2 == 0 { c1.clone() } else { c2.clone() },
                side: if i % 2 == 0 { Side::Buy } else { Side::Sell },
                quantity: 1 + (i % 5) as u32,
                order_type: OrderType::Market,
                limit_price: None,
                stop_price: None,
                time_in_force: TimeInForce::Day,
            },
            status: OrderStatus::Filled,
            filled_quantity: 1 + (i % 5) as u32,
            avg_fill_price: p("68.00"),
            action_id: None,
            created_at: now - 10_000_000 + i as i64 * 1000,
            updated_at: now - 10_000_000 + i as i64 * 1000,
            version: 1,
            versions: Vec::new(),
        });
        if batch.len() == 1000 {
            w.put_orders(&batch).await?;
            batch.clear();
        }
    }
    if !batch.is_empty() {
        w.put_orders(&batch).await?;
    }
    Ok(())
}
