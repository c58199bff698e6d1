//! An account's P&L on the trading day, read for the `daily_loss` check (plan, execute,
//! the worker before the broker) and `GET /portfolio`: its positions (each with what its
//! fills realized that day) and the reference prices of the open ones.

use chrono::{DateTime, Utc};

use crate::core::auth::DeskScope;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::pnl::{trading_day, DayPnl, Held};
use crate::core::domain::Position;
use crate::core::error::ApiError;
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

/// The day's P&L of positions already read (`GET /portfolio` has them).
pub async fn day_pnl_of(
    prices: &dyn Prices,
    held: &[Position],
    now: DateTime<Utc>,
) -> Result<DayPnl, ApiError> {
    let day = trading_day(ExchangeCalendar::cme(), now);
    let open: Vec<&str> = held
        .iter()
        .filter(|p| p.quantity != 0)
        .map(|p| p.symbol.as_str())
        .collect();
    let refs = if open.is_empty() {
        Vec::new()
    } else {
        prices.reference_prices(&open).await?
    };
    let rows: Vec<Held> = held
        .iter()
        .map(|p| Held {
            symbol: &p.symbol,
            quantity: p.quantity,
            avg_price: p.avg_price,
            day_realized: p.day_realized.as_ref(),
            reference: open
                .iter()
                .position(|s| *s == p.symbol)
                .and_then(|n| refs.get(n).copied().flatten()),
        })
        .collect();
    Ok(DayPnl::of(day, &rows))
}
