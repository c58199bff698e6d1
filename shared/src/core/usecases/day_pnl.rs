//! An account's P&L on the trading day, read for the `daily_loss` check (plan, execute,
//! the worker before the broker) and `GET /portfolio`: its positions (each with what its
//! fills realized that day) and the reference prices of the open ones.

use chrono::{DateTime, Utc};

use crate::core::auth::DeskScope;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::pnl::{trading_day, DayPnl, Held};
use crate::core::domain::{Position, Price};
use crate::core::error::ApiError;
use crate::core::ports::Quote;
use crate::core::ports::{Page, PositionStore, Prices};

/// Positions read per page.
const PAGE: u32 = 200;

/// Every position of the account (the caller was allowed to see it already), every page.
pub(crate) async fn positions_of(
    store: &dyn PositionStore,
    account_id: &str,
) -> Result<Vec<Position>, ApiError> {
    let mut out: Vec<Position> = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_positions(
                &DeskScope::All,
                Some(account_id),
                &Page { after, limit: PAGE },
            )
            .await?;
        let full = page.len() == PAGE as usize;
        after = page
            .last()
            .map(|p| (p.account_id.clone(), p.symbol.clone()));
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// The account's P&L on the trading day of `now`: two reads (its positions, then the
/// reference prices of the open ones in one call).
pub async fn account_day_pnl(
    positions: &dyn PositionStore,
    prices: &dyn Prices,
    account_id: &str,
    now: DateTime<Utc>,
) -> Result<DayPnl, ApiError> {
    let held = positions_of(positions, account_id).await?;
    day_pnl_of(prices, &held, now).await
}

/// The account's P&L on the trading day of `now` and the quote of the contract an order is
/// in (`None`: not a listed contract): its positions, then the quotes of that contract and
/// of the open positions in one call, two reads whatever the account holds.
pub async fn day_pnl_and_quote(
    positions: &dyn PositionStore,
    prices: &dyn Prices,
    account_id: &str,
    symbol: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(DayPnl, Option<Quote>), ApiError> {
    let held = positions_of(positions, account_id).await?;
    let mut wanted: Vec<&str> = symbol.into_iter().collect();
    wanted.extend(open_symbols(&held).filter(|s| Some(*s) != symbol));
    let quotes = prices.quotes(&wanted).await?;
    let quote = symbol.and_then(|_| quotes.first().copied().flatten());
    let price_of = |s: &str| {
        wanted
            .iter()
            .position(|w| *w == s)
            .and_then(|n| quotes.get(n).copied().flatten())
            .map(|q| q.price)
    };
    Ok((day_pnl_priced(&held, now, price_of), quote))
}

/// The day's P&L of positions already read (`GET /portfolio` has them).
pub async fn day_pnl_of(
    prices: &dyn Prices,
    held: &[Position],
    now: DateTime<Utc>,
) -> Result<DayPnl, ApiError> {
    let open: Vec<&str> = open_symbols(held).collect();
    let refs = if open.is_empty() {
        Vec::new()
    } else {
        prices.reference_prices(&open).await?
    };
    Ok(day_pnl_priced(held, now, |s| {
        open.iter()
            .position(|o| *o == s)
            .and_then(|n| refs.get(n).copied().flatten())
    }))
}

/// The contracts of the open positions.
fn open_symbols(held: &[Position]) -> impl Iterator<Item = &str> {
    held.iter()
        .filter(|p| p.quantity != 0)
        .map(|p| p.symbol.as_str())
}

/// The day's P&L of positions, each open one at `reference(symbol)`.
fn day_pnl_priced(
    held: &[Position],
    now: DateTime<Utc>,
    reference: impl Fn(&str) -> Option<Price>,
) -> DayPnl {
    let day = trading_day(ExchangeCalendar::cme(), now);
    let rows: Vec<Held> = held
        .iter()
        .map(|p| Held {
            symbol: &p.symbol,
            quantity: p.quantity,
            avg_price: p.avg_price,
            day_realized: p.day_realized.as_ref(),
            reference: if p.quantity != 0 {
                reference(&p.symbol)
            } else {
                None
            },
        })
        .collect();
    DayPnl::of(day, &rows)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use chrono::TimeZone;

    use super::*;
    use crate::core::domain::Exposure;
    use crate::core::error::StoreResult;
    use crate::core::ports::Page;

    struct Book(Vec<Position>);

    #[async_trait]
    impl PositionStore for Book {
        async fn list_positions(
            &self,
            _: &DeskScope,
            _: Option<&str>,
            _: &Page<(String, String)>,
        ) -> StoreResult<Vec<Position>> {
            Ok(self.0.clone())
        }
        async fn get_position(&self, _: &str, _: &str) -> StoreResult<Option<Position>> {
            unreachable!("not read for the day's P&L")
        }
        async fn get_exposure(&self, _: &str, _: &str) -> StoreResult<Exposure> {
            unreachable!("not read for the day's P&L")
        }
    }

    /// Prices that remember every call.
    #[derive(Default)]
    struct Asked(Mutex<Vec<Vec<String>>>);

    #[async_trait]
    impl Prices for Asked {
        async fn quote(&self, symbol: &str) -> StoreResult<Option<Quote>> {
            Ok(self.quotes(&[symbol]).await?[0])
        }
        async fn quotes(&self, symbols: &[&str]) -> StoreResult<Vec<Option<Quote>>> {
            self.0
                .lock()
                .unwrap()
                .push(symbols.iter().map(|s| s.to_string()).collect());
            Ok(symbols
                .iter()
                .map(|s| {
                    (*s != "CLH27").then(|| Quote {
                        price: Price::parse(if *s == "CLF27" { "70.00" } else { "60.00" }).unwrap(),
                        observed_at: Some(1),
                    })
                })
                .collect())
        }
    }

    fn held(symbol: &str, quantity: i64, avg: &str) -> Position {
        Position {
            account_id: "ACC-1".into(),
            symbol: symbol.into(),
            quantity,
            avg_price: Some(Price::parse(avg).unwrap()),
            updated_at: 0,
            day_realized: None,
        }
    }

    #[tokio::test]
    async fn the_order_quote_and_every_open_positions_price_come_in_one_read() {
        let book = Book(vec![
            held("CLF27", 2, "69.00"),
            held("CLG27", -1, "61.00"),
            held("CLH27", 3, "50.00"),
            held("CLJ27", 0, "55.00"),
        ]);
        let prices = Asked::default();
        let now = Utc.with_ymd_and_hms(2026, 11, 23, 15, 0, 0).unwrap();
        let (pnl, quote) = day_pnl_and_quote(&book, &prices, "ACC-1", Some("CLG27"), now)
            .await
            .unwrap();
        // The order's contract first, then the other open ones; a flat position is not asked.
        assert_eq!(
            *prices.0.lock().unwrap(),
            [vec!["CLG27".to_string(), "CLF27".into(), "CLH27".into()]]
        );
        assert_eq!(quote.map(|q| q.price), Price::parse("60.00").ok());
        // CLF27 +2 000 bbl x 1.00, CLG27 short 1 000 bbl x 1.00; CLH27 has no price.
        assert_eq!(pnl.unrealized, rust_decimal::Decimal::from(3_000));
        assert_eq!(pnl.unpriced, ["CLH27"]);
        // No order contract: the open positions alone.
        let prices = Asked::default();
        let (again, quote) = day_pnl_and_quote(&book, &prices, "ACC-1", None, now)
            .await
            .unwrap();
        assert_eq!(quote, None);
        assert_eq!(again, pnl);
        assert_eq!(prices.0.lock().unwrap().len(), 1);
    }
}
