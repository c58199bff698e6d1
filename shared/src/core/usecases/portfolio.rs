//! The portfolio read use cases: an account's positions valued at the reference prices,
//! the book's allocation across contract months, sides and desks, and its risk flags. The
//! figures are `domain::portfolio`'s; this module gathers what they need (the positions the
//! caller may see, the reference prices, the policy in force, today's trade date) and
//! shapes the answers. Money is decimal text, never binary floating point.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::core::auth::{Caller, DeskScope, Permission};
use crate::core::clock::SharedClock;
use crate::core::domain::portfolio::{self, Holding, Valued};
use crate::core::domain::{rfc3339, Account, Position, Price};
use crate::core::error::ApiError;
use crate::core::policy::Policy;
use crate::core::ports::{AccountStore, ControlStore, Page, PositionStore, Prices};

/// Where reference prices come from (the answers name it).
pub const PRICE_SOURCE: &str = "paper broker reference prices";

/// Positions read per page while gathering a book.
const PAGE: u32 = 200;

/// The portfolio use case, built once per process (`app.rs`).
#[derive(Clone)]
pub struct Portfolios {
    pub clock: SharedClock,
    pub policy: Arc<Policy>,
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    pub prices: Arc<dyn Prices>,
    pub control: Arc<dyn ControlStore>,
}

/// One position, valued.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PositionValue {
    pub account_id: String,
    pub symbol: String,
    /// `"2027-01"`; `null` for a symbol that is not a CL contract.
    pub contract_month: Option<String>,
    /// Signed contracts (long > 0, short < 0).
    pub quantity: i64,
    pub avg_price: Option<String>,
    pub reference_price: Option<String>,
    /// USD, signed: quantity x 1,000 barrels x reference price; `null` without a price.
    pub notional: Option<String>,
    /// USD: quantity x 1,000 x (reference price - average price).
    pub unrealized_pnl: Option<String>,
}

/// The book's totals.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PortfolioTotals {
    /// USD, sum of the absolute notionals.
    pub gross_notional: String,
    /// USD, sum of the signed notionals.
    pub net_notional: String,
    pub net_contracts: i64,
    pub unrealized_pnl: String,
    /// Positions left out of the notionals: no reference price.
    pub unpriced_positions: usize,
}

/// The account's P&L on the CME trading day and its daily loss budget (`daily_loss`).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DayPnlView {
    /// The trading day (CME trade date, `YYYY-MM-DD`): from the previous session's close
    /// (16:00 CT) to this day's close; the evening session from 17:00 CT belongs to it.
    pub trading_day: String,
    /// USD realized by the day's fills: each contract a fill closed, against the
    /// position's average entry price.
    pub realized: String,
    /// USD on the open positions: quantity x 1,000 x (reference price - average price).
    pub unrealized: String,
    /// `realized + unrealized`.
    pub total: String,
    /// The policy's `max_daily_loss` (USD); `null`: no limit.
    pub max_daily_loss: Option<String>,
    /// What is left of the limit: `max_daily_loss` minus the day's loss, never below 0;
    /// `null` without a limit.
    pub remaining: Option<String>,
    /// The loss is at or beyond the limit: only orders that reduce a position without
    /// flipping it pass until the next trading day.
    pub close_only: bool,
    /// Open positions left out of `unrealized` (no reference or average price).
    pub unpriced: Vec<String>,
}

/// `GET /portfolio?account_id=`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PortfolioView {
    pub account_id: String,
    pub positions: Vec<PositionValue>,
    pub totals: PortfolioTotals,
    pub day_pnl: DayPnlView,
    /// When the reference prices were read (RFC 3339).
    pub as_of: String,
    pub price_source: &'static str,
}

/// One slice of an allocation.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ShareView {
    pub key: String,
    pub gross_notional: String,
    /// Percent of the gross notional, two decimals; the slices sum to exactly 100.00.
    pub percent: String,
}

/// `GET /portfolio/allocation`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AllocationView {
    /// The account, or `null` for every account the operator may see.
    pub account_id: Option<String>,
    pub gross_notional: String,
    pub by_contract_month: Vec<ShareView>,
    /// `long` and `short`.
    pub by_side: Vec<ShareView>,
    pub by_desk: Vec<ShareView>,
    pub as_of: String,
    pub price_source: &'static str,
}

/// One risk flag and the figures behind it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FlagView {
    /// `concentration`, `near_limit`, `close_only` or `delivery`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `warn` or `fail`.
    pub severity: &'static str,
    pub message: String,
    pub figures: BTreeMap<&'static str, String>,
}

/// Long and short contracts, and net contracts per contract month.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct CalendarExposureView {
    pub long_contracts: i64,
    pub short_contracts: i64,
    pub net_by_contract_month: BTreeMap<String, i64>,
}

/// `GET /portfolio/risk-flags?account_id=`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RiskFlagsView {
    pub account_id: String,
    pub flags: Vec<FlagView>,
    pub calendar_exposure: CalendarExposureView,
    /// The trade date the delivery windows are counted from (Chicago).
    pub trade_date: String,
    pub policy_version: String,
    pub as_of: String,
}

fn text(d: rust_decimal::Decimal) -> String {
    let mut d = d.normalize();
    if d.scale() < 2 {
        d.rescale(2);
    }
    d.to_string()
}

fn price_text(p: Option<Price>) -> Option<String> {
    p.map(|p| p.to_string())
}

/// Every position on `desks` (of one account, or of all), every page.
async fn all_positions(
    store: &dyn PositionStore,
    desks: &DeskScope,
    account_id: Option<&str>,
) -> Result<Vec<Position>, ApiError> {
    let mut positions: Vec<Position> = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_positions(desks, account_id, &Page { after, limit: PAGE })
            .await?;
        let full = page.len() == PAGE as usize;
        after = page
            .last()
            .map(|p| (p.account_id.clone(), p.symbol.clone()));
        positions.extend(page);
        if !full {
            return Ok(positions);
        }
    }
}

/// `positions` valued at the reference prices (one read of the prices), each with the
/// desk of its account (`desk_of`); and the reference price of `also`, when asked.
async fn value_all(
    prices: &dyn Prices,
    positions: &[Position],
    desk_of: impl Fn(&str) -> String,
    also: Option<&str>,
) -> Result<(Vec<Valued>, Option<Price>), ApiError> {
    let mut symbols: Vec<&str> = positions.iter().map(|p| p.symbol.as_str()).collect();
    symbols.extend(also);
    symbols.sort_unstable();
    symbols.dedup();
    let refs: BTreeMap<&str, Option<Price>> = symbols
        .iter()
        .copied()
        .zip(prices.reference_prices(&symbols).await?)
        .collect();
    let valued = positions
        .iter()
        .map(|p| {
            portfolio::value(
                Holding {
                    account_id: p.account_id.clone(),
                    desk: desk_of(&p.account_id),
                    symbol: p.symbol.clone(),
                    quantity: p.quantity,
                    avg_price: p.avg_price,
                },
                refs.get(p.symbol.as_str()).copied().flatten(),
            )
        })
        .collect();
    Ok((valued, also.and_then(|s| refs.get(s).copied().flatten())))
}

/// One account's positions, valued, and the reference price of `symbol`: what plan's
/// what-if check starts from (two reads: the positions, the prices). The caller has
/// already been allowed to see the account.
pub async fn account_book(
    positions: &dyn PositionStore,
    prices: &dyn Prices,
    account: &Account,
    symbol: &str,
) -> Result<(Vec<Valued>, Option<Price>), ApiError> {
    // Every desk: the account was found visible already, so the store need not read it
    // again for its desk (one DynamoDB call fewer per plan).
    let held = all_positions(positions, &DeskScope::All, Some(&account.account_id)).await?;
    value_all(prices, &held, |_| account.desk.clone(), Some(symbol)).await
}

impl Portfolios {
    /// The caller's visible positions (of one account, or of every account on their
    /// desks), valued at the reference prices, with the accounts they belong to.
    async fn book(
        &self,
        caller: &Caller,
        account_id: Option<&str>,
    ) -> Result<(Vec<Account>, Vec<Valued>), ApiError> {
        caller.require(Permission::Read)?;
        let mut accounts = Vec::new();
        if let Some(id) = account_id {
            accounts.push(super::reads::visible_account(self.accounts.as_ref(), caller, id).await?);
        }
        let positions =
            all_positions(self.positions.as_ref(), &caller.operator.desks, account_id).await?;
        if account_id.is_none() {
            let mut ids: Vec<&str> = positions.iter().map(|p| p.account_id.as_str()).collect();
            ids.dedup();
            for id in ids {
                if let Some(a) = self.accounts.get_account(id).await? {
                    accounts.push(a);
                }
            }
        }
        let desk_of: BTreeMap<&str, &str> = accounts
            .iter()
            .map(|a| (a.account_id.as_str(), a.desk.as_str()))
            .collect();
        let (valued, _) = value_all(
            self.prices.as_ref(),
            &positions,
            |id| desk_of.get(id).unwrap_or(&"").to_string(),
            None,
        )
        .await?;
        Ok((accounts, valued))
    }

    /// The account's P&L on the trading day under the policy in force.
    async fn day_pnl(&self, account_id: &str) -> Result<DayPnlView, ApiError> {
        let control = self.control.get_control().await?;
        let limit = crate::core::policy::in_force(&self.policy, &control).max_daily_loss;
        let p = super::day_pnl::account_day_pnl(
            self.positions.as_ref(),
            self.prices.as_ref(),
            account_id,
            self.clock.now(),
        )
        .await?;
        Ok(DayPnlView {
            trading_day: p.trading_day.to_string(),
            realized: text(p.realized),
            unrealized: text(p.unrealized),
            total: text(p.total),
            max_daily_loss: limit.map(text),
            remaining: limit.map(|l| text(p.remaining(l))),
            close_only: p.breaches(limit),
            unpriced: p.unpriced,
        })
    }

    fn as_of(&self) -> String {
        rfc3339(self.clock.now_ms())
    }

    /// `GET /portfolio?account_id=`: each position's notional and unrealized P&L, and the
    /// totals.
    pub async fn portfolio(
        &self,
        caller: &Caller,
        account_id: &str,
    ) -> Result<PortfolioView, ApiError> {
        let (_, book) = self.book(caller, Some(account_id)).await?;
        let t = portfolio::totals(&book);
        let day_pnl = self.day_pnl(account_id).await?;
        Ok(PortfolioView {
            account_id: account_id.to_string(),
            positions: book
                .iter()
                .map(|v| PositionValue {
                    account_id: v.holding.account_id.clone(),
                    symbol: v.holding.symbol.clone(),
                    contract_month: v.contract_month.clone(),
                    quantity: v.holding.quantity,
                    avg_price: price_text(v.holding.avg_price),
                    reference_price: price_text(v.reference_price),
                    notional: v.notional.map(text),
                    unrealized_pnl: v.unrealized_pnl.map(text),
                })
                .collect(),
            totals: PortfolioTotals {
                gross_notional: text(t.gross_notional),
                net_notional: text(t.net_notional),
                net_contracts: t.net_contracts,
                unrealized_pnl: text(t.unrealized_pnl),
                unpriced_positions: t.unpriced_positions,
            },
            day_pnl,
            as_of: self.as_of(),
            price_source: PRICE_SOURCE,
        })
    }

    /// `GET /portfolio/allocation[?account_id=]`: gross notional by contract month, side
    /// and desk, as percentages that sum to 100.
    pub async fn allocation(
        &self,
        caller: &Caller,
        account_id: Option<&str>,
    ) -> Result<AllocationView, ApiError> {
        let (_, book) = self.book(caller, account_id).await?;
        let view = |shares: Vec<portfolio::Share>| {
            shares
                .into_iter()
                .map(|s| ShareView {
                    key: s.key,
                    gross_notional: text(s.gross_notional),
                    percent: s.percent.to_string(),
                })
                .collect()
        };
        Ok(AllocationView {
            account_id: account_id.map(String::from),
            gross_notional: text(portfolio::totals(&book).gross_notional),
            by_contract_month: view(portfolio::shares(&book, |v| {
                v.contract_month
                    .clone()
                    .unwrap_or_else(|| v.holding.symbol.clone())
            })),
            by_side: view(portfolio::shares(&book, |v| {
                if v.holding.quantity >= 0 {
                    "long"
                } else {
                    "short"
                }
                .to_string()
            })),
            by_desk: view(portfolio::shares(&book, |v| v.holding.desk.clone())),
            as_of: self.as_of(),
            price_source: PRICE_SOURCE,
        })
    }

    /// `GET /portfolio/risk-flags?account_id=`: the account's flags under the policy in
    /// force, and its calendar exposure.
    pub async fn risk_flags(
        &self,
        caller: &Caller,
        account_id: &str,
    ) -> Result<RiskFlagsView, ApiError> {
        let (_, book) = self.book(caller, Some(account_id)).await?;
        let control = self.control.get_control().await?;
        let pol = crate::core::policy::in_force(&self.policy, &control);
        let today = trade_date(self.clock.now_ms());
        let flags = portfolio::risk_flags(
            &book,
            today,
            crate::core::domain::calendar::ExchangeCalendar::cme(),
            &pol.portfolio_thresholds(),
        );
        let e = portfolio::calendar_exposure(&book);
        Ok(RiskFlagsView {
            account_id: account_id.to_string(),
            flags: flags
                .into_iter()
                .map(|f| FlagView {
                    kind: f.kind,
                    severity: match f.severity {
                        portfolio::Severity::Warn => "warn",
                        portfolio::Severity::Fail => "fail",
                    },
                    message: f.message,
                    figures: f.figures,
                })
                .collect(),
            calendar_exposure: CalendarExposureView {
                long_contracts: e.long_contracts,
                short_contracts: e.short_contracts,
                net_by_contract_month: e.by_month,
            },
            trade_date: today.to_string(),
            policy_version: pol.version.clone(),
            as_of: self.as_of(),
        })
    }
}

/// The trade date in Chicago at `now` (business days count from it).
pub fn trade_date(now: crate::core::domain::Millis) -> chrono::NaiveDate {
    chrono::DateTime::from_timestamp_millis(now)
        .unwrap_or_default()
        .with_timezone(&chrono_tz::America::Chicago)
        .date_naive()
}
