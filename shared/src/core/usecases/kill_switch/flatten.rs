//! Flattening (`kill-switch engage --flatten`, off by default): the engage then queues, for every open position of the accounts
//! (net quantity not zero), one closing `order.submit.cl`: the opposite side, the net
//! quantity, a day order protected as a market order is (a limit at the reference price
//! less or plus `market_protection_points`). It is checked here as the worker will check
//! it (a fresh reference price, the market open, the order size, the account active), and
//! a position that fails is reported, not flattened. It is stored and queued as a cancel
//! is, reserving its contracts on the exposure in the same write as an execute does, and
//! named after the engagement, the account and the contract. It closes the filled position
//! read now: a working order pulled in the same engage that fills before its cancel lands
//! changes the position, and the worker's check before the broker (the order may only
//! reduce the position it finds then, never increase or reverse it) refuses the closing
//! order rather than reverse the position. The worker lets these orders, and only these,
//! through the engaged switch ([`is_flattening`]).

use super::*;

/// The id of an engagement's `attempt`-th closing order of a position: the same for every
/// engage of the engagement, so a second engage finds it instead of queuing another.
pub fn flatten_action_id(engagement: &str, account_id: &str, symbol: &str, attempt: u32) -> String {
    let digest = sha256_hex(
        format!(
            "{PRINCIPAL}\u{0}flatten\u{0}{engagement}\u{0}{account_id}\u{0}{symbol}\u{0}{attempt}"
        )
        .as_bytes(),
    );
    format!("act_{}", &digest[..26])
}

/// The idempotency key of that closing order.
pub fn flatten_key(engagement: &str, account_id: &str, symbol: &str, attempt: u32) -> String {
    format!("{PRINCIPAL}:{engagement}:flatten:{account_id}:{symbol}:{attempt}")
}

/// Whether `action_id` is one of the engagement's closing orders of that position.
pub(super) fn is_flatten_id(
    engagement: &str,
    account_id: &str,
    symbol: &str,
    action_id: &str,
) -> bool {
    (0..MAX_ATTEMPTS).any(|a| flatten_action_id(engagement, account_id, symbol, a) == action_id)
}

/// Whether a stored queue message is a closing order the kill switch queued (of any
/// engagement): such an order may only reduce the position ([`reduces_only`]).
pub fn is_closing_order(msg: &QueueMessage) -> bool {
    msg.service_principal == PRINCIPAL && msg.action_type == ActionType::OrderSubmitCl
}

/// Whether a stored queue message is a closing order of the switch's current engagement,
/// the one order the engaged switch lets through at the worker. Every field it keys on is
/// set by the server: the service principal (execute takes it from the caller's verified
/// token), the plan id (execute's is its plan's, a `pln_` id; here the engagement's, made
/// by the engage) and the action id (execute's is random; here derived from the
/// engagement, the account and the contract). An execute cannot produce one.
pub fn is_flattening(msg: &QueueMessage, control: &Control) -> bool {
    let Some(e) = control
        .engagement
        .as_ref()
        .filter(|_| !control.trade_execute_enabled)
    else {
        return false;
    };
    let Some(order) = msg.normalized_payload.order() else {
        return false;
    };
    is_closing_order(msg)
        && msg.plan_id == e.id
        && is_flatten_id(
            &e.id,
            &order.terms.account_id,
            &order.terms.symbol,
            &msg.action_id,
        )
}

/// While the switch is engaged, why `order` (one of its current engagement's closing
/// orders) is not cancelled or changed by an action `msg` the switch did not queue; `None`
/// for any other order, or once released. The agent's token confirms a cancel, and a
/// change that only lowers the quantity: without this it could undo the flattening.
pub fn keeps_closing_order(order: &Order, control: &Control, msg: &QueueMessage) -> Option<String> {
    let e = control
        .engagement
        .as_ref()
        .filter(|_| !control.trade_execute_enabled)?;
    let action_id = order.action_id.as_deref()?;
    if msg.service_principal == PRINCIPAL
        || !is_flatten_id(
            &e.id,
            &order.terms.account_id,
            &order.terms.symbol,
            action_id,
        )
    {
        return None;
    }
    Some(format!(
        "kill_switch_flatten: order {} is the kill switch's closing order of engagement {}; \
         it is neither cancelled nor changed while the switch is engaged",
        order.order_id, e.id
    ))
}

/// `Ok` if a closing order of `quantity` on `side` only reduces `position` (the net
/// quantity found now): the opposite side, no more than the position. `Err`: why it would
/// increase or reverse it.
pub fn reduces_only(position: i64, side: Side, quantity: u32) -> Result<(), String> {
    let q = i64::from(quantity);
    let after = match side {
        Side::Buy => position.saturating_add(q),
        Side::Sell => position.saturating_sub(q),
    };
    let reduces = match side {
        Side::Buy => position < 0 && after <= 0,
        Side::Sell => position > 0 && after >= 0,
    };
    if reduces {
        return Ok(());
    }
    let what = if position == 0 {
        format!("the position is flat now, and this closing {side} of {quantity} would open one ({after:+})")
    } else {
        let how = if after.signum() == position.signum() {
            "increase"
        } else {
            "reverse"
        };
        format!("the position is {position:+} now, and this closing {side} of {quantity} would {how} it ({after:+})")
    };
    Err(format!(
        "kill_switch_flatten: {what}; the kill switch's closing orders only reduce a position, so it was not sent"
    ))
}

impl KillSwitch {
    /// A closing order for every open position of `accounts` (every account: `None`).
    pub(super) async fn flatten(
        &self,
        control: &Control,
        engagement: &str,
        by: &str,
        accounts: Option<&[Account]>,
    ) -> Result<Vec<Flattened>, ApiError> {
        let accounts = match accounts {
            Some(a) => a.to_vec(),
            None => self.all_accounts().await?,
        };
        let pol = policy::in_force(&self.policy, control);
        let mut out = Vec::new();
        for account in &accounts {
            let held = crate::core::usecases::day_pnl::positions_of(
                self.positions.as_ref(),
                &account.account_id,
            )
            .await?;
            let open: Vec<&Position> = held.iter().filter(|p| p.quantity != 0).collect();
            if open.is_empty() {
                continue;
            }
            let day_pnl = crate::core::usecases::day_pnl::day_pnl_of(
                self.prices.as_ref(),
                &held,
                self.clock.now(),
            )
            .await?;
            for p in open {
                let side = if p.quantity > 0 {
                    Side::Sell
                } else {
                    Side::Buy
                };
                let mut f = Flattened {
                    account_id: p.account_id.clone(),
                    symbol: p.symbol.clone(),
                    position: p.quantity,
                    side,
                    limit_price: None,
                    action_id: None,
                    outcome: Pull::AlreadyQueued,
                };
                match self
                    .flatten_one(&Closing {
                        engagement,
                        by,
                        account,
                        position: p,
                        pol,
                        day_pnl: &day_pnl,
                    })
                    .await
                {
                    Ok((action_id, limit, outcome)) => {
                        f.action_id = action_id;
                        f.limit_price = limit;
                        f.outcome = outcome;
                    }
                    Err(e) => f.outcome = Pull::NotQueued(e.cause.unwrap_or(e.message)),
                }
                out.push(f);
            }
        }
        Ok(out)
    }

    /// Every account, every page.
    async fn all_accounts(&self) -> Result<Vec<Account>, ApiError> {
        const PAGE: u32 = 200;
        let mut out: Vec<Account> = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .accounts
                .list_accounts(&DeskScope::All, &Page { after, limit: PAGE })
                .await?;
            let full = page.len() == PAGE as usize;
            after = page.last().map(|a| a.account_id.clone());
            out.extend(page);
            if !full {
                return Ok(out);
            }
        }
    }

    /// This engagement's closing order of one position: found (queued, or at the broker),
    /// or queued now under the next attempt number, or why not.
    async fn flatten_one(
        &self,
        c: &Closing<'_>,
    ) -> Result<(Option<String>, Option<Price>, Pull), ApiError> {
        let Closing {
            engagement,
            account,
            position,
            ..
        } = *c;
        let (account_id, symbol) = (&account.account_id, &position.symbol);
        for attempt in 0..MAX_ATTEMPTS {
            let action_id = flatten_action_id(engagement, account_id, symbol, attempt);
            let Some(a) = self.actions.get_action(&action_id).await? else {
                let (limit, outcome) = self.queue_closing(c, attempt).await?;
                let id = matches!(outcome, Pull::Queued | Pull::AlreadyQueued).then_some(action_id);
                return Ok((id, limit, outcome));
            };
            let limit = a
                .message
                .normalized_payload
                .order()
                .and_then(|o| o.terms.limit_price);
            match a.status {
                ActionStatus::Queued | ActionStatus::Processing => {
                    self.resend_if_unsent(&a).await;
                    return Ok((Some(action_id), limit, Pull::AlreadyQueued));
                }
                // Settled: still live if its order is at the broker; otherwise (refused,
                // rejected, filled, cancelled) the position left open needs another.
                _ => {
                    let live = match a.resource_refs.order_id.as_deref() {
                        Some(o) => self
                            .orders
                            .get_order(o)
                            .await?
                            .is_some_and(|o| o.status.is_at_the_broker()),
                        None => false,
                    };
                    if live {
                        return Ok((Some(action_id), limit, Pull::AlreadyQueued));
                    }
                }
            }
        }
        Ok((
            None,
            None,
            Pull::NotQueued(format!(
                "{MAX_ATTEMPTS} closing orders of {account_id} {symbol} ended in this engagement with the position still open"
            )),
        ))
    }

    /// Checks and queues one closing order: the opposite side, the net quantity, a day
    /// market order protected from the reference price read now, under the checks the
    /// worker makes before the broker; its contracts reserved as an execute reserves them.
    async fn queue_closing(
        &self,
        c: &Closing<'_>,
        attempt: u32,
    ) -> Result<(Option<Price>, Pull), ApiError> {
        let Closing {
            engagement,
            by,
            account,
            position,
            pol,
            day_pnl,
        } = *c;
        let (account_id, symbol) = (&account.account_id, &position.symbol);
        let side = if position.quantity > 0 {
            Side::Sell
        } else {
            Side::Buy
        };
        let not_queued = |why: String| Ok((None, Pull::NotQueued(why)));
        if account.status != AccountStatus::Active {
            return not_queued(format!(
                "account {account_id} is {}: its orders are not sent",
                account.status
            ));
        }
        let quantity = match Quantity::new(position.quantity.saturating_abs()) {
            Ok(q) => q,
            Err(why) => return not_queued(why),
        };
        let request = OrderSubmitCl {
            account_id: Ident::parse(account_id).map_err(ApiError::internal)?,
            symbol: symbol.clone(),
            side,
            quantity,
            order_type: OrderType::Market,
            limit_price: None,
            stop_price: None,
            time_in_force: TimeInForce::Day,
        };
        let contract = ClContract::parse(symbol).ok();
        let reference = self.prices.quote(symbol).await?;
        let (order, protection) = policy::protect(&request, reference.map(|q| q.price), pol);
        let cal = ExchangeCalendar::cme();
        let inputs = OrderInputs {
            policy: pol,
            calendar: cal,
            now: self.clock.now(),
            account_id,
            order: &order,
            contract,
            exposure: Default::default(),
            reference,
            day_pnl: Some(day_pnl),
        };
        if let Some(c) = policy::recheck_at_worker(&inputs)
            .into_iter()
            .find(crate::core::records::RiskCheck::failed)
        {
            return not_queued(format!("{}: {}", c.name, c.reason));
        }
        let terms = OrderTerms {
            account_id: account_id.clone(),
            symbol: contract
                .map(|c| c.symbol())
                .unwrap_or_else(|| symbol.clone()),
            side,
            quantity: quantity.get(),
            order_type: order.order_type,
            limit_price: order.limit_price,
            stop_price: None,
            time_in_force: TimeInForce::Day,
        };
        let limit = terms.limit_price;
        let reason = format!(
            "the kill switch flattens {account_id} {symbol} (position {:+}): {side} {} as a limit at {} ({})",
            position.quantity,
            quantity.get(),
            limit.map(|p| p.to_string()).unwrap_or_default(),
            match &protection {
                Some(p) => format!(
                    "the reference price {} {} market_protection_points {}",
                    p.from_price,
                    if side == Side::Buy { "plus" } else { "less" },
                    p.points
                ),
                None => "unprotected".into(),
            }
        );
        let queued = Queued {
            engagement,
            by,
            action_id: &flatten_action_id(engagement, account_id, symbol, attempt),
            key: flatten_key(engagement, account_id, symbol, attempt),
            account_id,
            desk: &account.desk,
            order_id: new_id("ord", self.clock.now_ms()),
            payload: NormalizedPayload::OrderSubmitCl(NormalizedOrder {
                contract_month: contract.map(|c| c.contract_month()),
                last_trade_date: contract.map(|c| c.last_trade_date(cal).to_string()),
                market_protection: protection,
                terms,
            }),
            reason,
            // As an execute reserves an order's contracts: within the position limit with
            // the open orders (the pulled ones until their cancels land), under the policy
            // in force (close-only past the daily loss limit).
            reserve: Some(Reservation {
                side,
                bound: policy::reservation_bound(&inputs),
                delta: ExposureDelta::reserve(account_id, symbol, side, i64::from(quantity.get())),
            }),
        };
        Ok(match self.queue(queued).await? {
            CommitOutcome::Committed => (limit, Pull::Queued),
            CommitOutcome::Conflict(Conflict::Key) => (limit, Pull::AlreadyQueued),
            CommitOutcome::Conflict(Conflict::Position) => (
                None,
                Pull::NotQueued(format!(
                    "position_limit: {account_id} {symbol}'s open {side} orders leave no room for a closing {side} of {} under the policy's limit (the pulled orders count until their cancels land); engage with --flatten again once they are cancelled",
                    quantity.get()
                )),
            ),
            CommitOutcome::Conflict(c) => {
                return Err(ApiError::internal(format!(
                    "a kill switch closing order met a condition it does not set: {c:?}"
                )))
            }
        })
    }
}

/// One position to close in an engagement, with what its checks read.
#[derive(Clone, Copy)]
struct Closing<'a> {
    engagement: &'a str,
    by: &'a str,
    account: &'a Account,
    position: &'a Position,
    pol: &'a Policy,
    day_pnl: &'a crate::core::domain::pnl::DayPnl,
}
