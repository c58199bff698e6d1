//! The pre-trade risk policy: versioned limits with defaults, a file override in local mode
//! (`<state-dir>/policy.json`), and the named checks of the contract. Pure functions: the
//! protocol gathers the inputs (account, position, control record, time) and records the
//! results.

pub mod checks;
mod control;
pub mod daily_loss;
pub mod protection;

pub use checks::{
    check_order_cancel, check_order_submit, check_positions_sync, position_gate, recheck_at_worker,
    recheck_order_at_execute, recheck_order_without_position, reservation_bound, CancelInputs,
    OrderInputs,
};
pub use control::{Control, RolloutMode};
pub use protection::{protect, protected_limit};

use std::collections::BTreeMap;
use std::path::Path;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::ActionType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

/// One named pre-trade check and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RiskCheck {
    pub name: String,
    pub status: CheckStatus,
    pub reason: String,
}

impl RiskCheck {
    pub fn pass(name: &str, reason: impl Into<String>) -> Self {
        RiskCheck {
            name: name.into(),
            status: CheckStatus::Pass,
            reason: reason.into(),
        }
    }
    pub fn warn(name: &str, reason: impl Into<String>) -> Self {
        RiskCheck {
            name: name.into(),
            status: CheckStatus::Warn,
            reason: reason.into(),
        }
    }
    pub fn fail(name: &str, reason: impl Into<String>) -> Self {
        RiskCheck {
            name: name.into(),
            status: CheckStatus::Fail,
            reason: reason.into(),
        }
    }
    pub fn failed(&self) -> bool {
        self.status == CheckStatus::Fail
    }
}

/// The policy in force: the control record's, when one is set there (`airlock policy
/// set`), else the process's own (`default`: the state dir's `policy.json` or the defaults).
pub fn in_force<'a>(default: &'a Policy, control: &'a Control) -> &'a Policy {
    control.policy.as_ref().unwrap_or(default)
}

/// Limits and switches of the risk policy. Unknown fields in a policy file are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Bumped whenever a limit changes; recorded on every plan and audit record.
    pub version: String,
    /// Contract roots that may trade.
    pub allowed_symbols: Vec<String>,
    /// Accounts that may trade; `None` means every active account.
    pub allowed_accounts: Option<Vec<String>>,
    /// Largest order, in contracts.
    pub max_order_size: u32,
    /// Largest absolute position per account and contract after the order.
    pub max_position: u32,
    /// Within this many business days of the last trading day only position-reducing
    /// orders pass.
    pub close_only_business_days: u32,
    /// Minimum price increment.
    pub tick: Decimal,
    /// Whether negative limit and stop prices may trade (CL settled at -37.63 in 2020).
    pub allow_negative_prices: bool,
    /// The price band: a limit or stop price may lie at most this percentage of the
    /// reference price away from it (`price_band`)...
    pub price_band_pct: Decimal,
    /// ...or this many dollars, whichever is wider (a reference near zero still has a band).
    pub price_band_min: Decimal,
    /// How each action type is confirmed: `operator` (a person approves on Airlock's own
    /// page with a passkey; the caller never holds a token) or `token` (the plan hands the
    /// caller a confirmation token). A type missing here takes [`default_confirmation`].
    pub confirmation: BTreeMap<String, ConfirmationMode>,
    /// Above this notional (USD: contracts x 1,000 barrels x the plan's reference price),
    /// an `order.submit.cl` in `operator` mode needs a second person's approval: another
    /// operator with `approve` on the plan's desk. `None`: never.
    pub four_eyes_above_notional: Option<Decimal>,
    /// Portfolio risk flags: a contract month above this share (%) of an account's gross
    /// notional is `concentration` (warn)...
    pub concentration_warn_pct: Decimal,
    /// ...also when the book is in one month only (off: such a book is deliberate).
    pub flag_single_month_book: bool,
    /// A position above this share (%) of `max_position` is `near_limit` (warn).
    pub near_limit_warn_pct: Decimal,
    /// A position this many business days or fewer before its last trading day is
    /// `delivery` (fail): CL settles by physical delivery at Cushing.
    pub delivery_fail_business_days: u32,
    /// A market or stop order goes to the broker as a limit this many dollars beyond the
    /// reference price (above it for a buy, below for a sell): the protected limit the
    /// person approves and `price_band` checks.
    pub market_protection_points: Decimal,
    /// A reference price older than this fails `price_band` (at plan, execute and the
    /// worker); `None`: prices of any age pass.
    pub max_quote_age_seconds: Option<u32>,
    /// An account whose loss on the trading day (realized plus unrealized, USD) reaches
    /// this is close-only until the next trading day (`daily_loss`); `None`: no limit.
    pub max_daily_loss: Option<Decimal>,
    /// Orders, changes and cancels an account may send in any `message_window_seconds`...
    pub max_messages_per_window: u32,
    /// ...the sliding window they are counted over...
    pub message_window_seconds: u32,
    /// ...and, once over, how long only cancels pass for that account.
    pub message_lockout_seconds: u32,
}

/// How the human confirmation of an action type is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfirmationMode {
    /// The operator approves on Airlock's approval page with a passkey; the plan carries no
    /// confirmation token and execute waits for the approval.
    Operator,
    /// The plan returns a confirmation token to the caller, who sends it to execute.
    Token,
}

impl ConfirmationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfirmationMode::Operator => "operator",
            ConfirmationMode::Token => "token",
        }
    }
}

/// The default confirmation of an action type: a person approves what can add risk (new
/// orders, changes of orders); cancels and syncs reduce risk and must work in a crisis, so
/// the caller's token confirms them.
pub fn default_confirmation(a: ActionType) -> ConfirmationMode {
    if a.can_add_risk() {
        ConfirmationMode::Operator
    } else {
        ConfirmationMode::Token
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: "default-1".into(),
            allowed_symbols: vec!["CL".into()],
            allowed_accounts: None,
            max_order_size: 10,
            max_position: 50,
            close_only_business_days: 2,
            tick: Decimal::new(1, 2),
            allow_negative_prices: true,
            price_band_pct: Decimal::new(20, 0),
            price_band_min: Decimal::new(100, 2),
            confirmation: ActionType::ALL
                .iter()
                .map(|a| (a.as_str().to_string(), default_confirmation(*a)))
                .collect(),
            four_eyes_above_notional: None,
            concentration_warn_pct: Decimal::from(25),
            flag_single_month_book: false,
            near_limit_warn_pct: Decimal::from(80),
            delivery_fail_business_days: 5,
            market_protection_points: Decimal::new(50, 2),
            max_quote_age_seconds: Some(300),
            max_daily_loss: Some(Decimal::from(100_000)),
            max_messages_per_window: 20,
            message_window_seconds: 3,
            message_lockout_seconds: 30,
        }
    }
}

impl Policy {
    /// The thresholds of the portfolio risk flags.
    pub fn portfolio_thresholds(&self) -> crate::core::domain::portfolio::Thresholds {
        crate::core::domain::portfolio::Thresholds {
            concentration_pct: self.concentration_warn_pct,
            flag_single_month_book: self.flag_single_month_book,
            near_limit_pct: self.near_limit_warn_pct,
            max_position: self.max_position,
            close_only_business_days: self.close_only_business_days,
            delivery_business_days: self.delivery_fail_business_days,
        }
    }

    /// The policy file if it exists, else the defaults.
    pub fn load_local(path: &Path) -> Result<Policy, String> {
        if !path.exists() {
            return Ok(Policy::default());
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let p: Policy =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        p.validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.version.trim().is_empty() {
            return Err("version must not be empty".into());
        }
        if self.tick <= Decimal::ZERO {
            return Err("tick must be positive".into());
        }
        if self.max_order_size == 0 || self.max_position == 0 {
            return Err("max_order_size and max_position must be at least 1".into());
        }
        if self.price_band_pct <= Decimal::ZERO || self.price_band_pct > Decimal::new(100, 0) {
            return Err("price_band_pct must be more than 0 and at most 100".into());
        }
        if self.price_band_min < Decimal::ZERO || self.price_band_min > Decimal::new(1000, 0) {
            return Err("price_band_min must be between 0 and 1000".into());
        }
        if let Some(t) = self.four_eyes_above_notional {
            if t < Decimal::ZERO {
                return Err("four_eyes_above_notional must not be negative".into());
            }
        }
        for (name, pct) in [
            ("concentration_warn_pct", self.concentration_warn_pct),
            ("near_limit_warn_pct", self.near_limit_warn_pct),
        ] {
            if pct <= Decimal::ZERO || pct > Decimal::new(100, 0) {
                return Err(format!("{name} must be more than 0 and at most 100"));
            }
        }
        if self.delivery_fail_business_days > 60 {
            return Err("delivery_fail_business_days must be at most 60".into());
        }
        if self.market_protection_points <= Decimal::ZERO
            || self.market_protection_points > Decimal::from(1000)
        {
            return Err("market_protection_points must be more than 0 and at most 1000".into());
        }
        if self.max_quote_age_seconds == Some(0) {
            return Err("max_quote_age_seconds must be at least 1 (null: no limit)".into());
        }
        if let Some(l) = self.max_daily_loss {
            if l <= Decimal::ZERO {
                return Err("max_daily_loss must be positive (null: no limit)".into());
            }
        }
        if self.max_messages_per_window == 0 {
            return Err("max_messages_per_window must be at least 1".into());
        }
        if !(1..=3600).contains(&self.message_window_seconds) {
            return Err("message_window_seconds must be between 1 and 3600".into());
        }
        if self.message_lockout_seconds > 86_400 {
            return Err("message_lockout_seconds must be at most 86400".into());
        }
        for k in self.confirmation.keys() {
            if k.parse::<ActionType>().is_err() {
                return Err(format!("confirmation: unknown action type {k}"));
            }
        }
        Ok(())
    }

    /// How `a` is confirmed under this policy.
    pub fn confirmation(&self, a: ActionType) -> ConfirmationMode {
        self.confirmation
            .get(a.as_str())
            .copied()
            .unwrap_or_else(|| default_confirmation(a))
    }

    /// Whether an order of this notional (USD, absolute) needs a second person.
    pub fn needs_four_eyes(&self, notional: Option<Decimal>) -> bool {
        match self.four_eyes_above_notional {
            None => false,
            // No reference price to measure with: the second person is the safe answer.
            Some(limit) => notional.is_none_or(|n| n > limit),
        }
    }

    /// The version recorded on plans: the policy's and the calendar's.
    pub fn full_version(&self, cal: &ExchangeCalendar) -> String {
        format!("{}+{}", self.version, cal.version())
    }
}
