//! `airlock kill-switch engage | release | status`: the kill switch use case
//! (`core::usecases::kill_switch`) on the backend's ports, and its output. `engage` exits
//! non-zero when a working order could not be pulled or an open position (`--flatten`)
//! was not flattened, after printing what was done and why the rest was not.

use airlock::app::{AppState, Backend};
use airlock::config::Config;
use airlock::core::domain::human_time;
use airlock::core::usecases::kill_switch::{EngageOptions, KillSwitch, Pull};

use crate::commands::{print_control, state, who};

/// The kill switch use case on the backend's ports.
fn kill_switch_of(state: &AppState) -> KillSwitch {
    let p = &state.ports;
    KillSwitch {
        clock: state.clock.clone(),
        control: p.control.clone(),
        accounts: p.accounts.clone(),
        orders: p.orders.clone(),
        actions: p.actions.clone(),
        ledger: p.ledger.clone(),
        audit: p.audit.clone(),
        dispatch: state.execute.dispatch.clone(),
        relist_after: std::time::Duration::from_millis(1_000),
        policy: state.policy.clone(),
        positions: p.positions.clone(),
        prices: p.prices.clone(),
    }
}

fn api_error(e: airlock::core::error::ApiError) -> String {
    match e.cause {
        Some(c) if c != e.message => format!("{}: {c}", e.message),
        _ => e.message,
    }
}

pub async fn run(
    cfg: Config,
    backend: Backend,
    action: &str,
    opts: EngageOptions,
) -> Result<(), String> {
    if action != "engage" && (opts.accounts.is_some() || opts.keep_working || opts.flatten) {
        return Err("--accounts, --keep-working and --flatten go with `engage`".into());
    }
    if opts.accounts.as_ref().is_some_and(Vec::is_empty) {
        return Err("--accounts: name at least one account".into());
    }
    let state = state(cfg, backend).await?;
    let ks = kill_switch_of(&state);
    match action {
        "engage" => {
            let engaged = ks.engage(&who(), &opts).await.map_err(api_error)?;
            print_control(&engaged.control);
            if opts.keep_working {
                outln!("working orders kept (--keep-working)");
            }
            let mut failed = 0;
            for p in &engaged.pulled {
                let what = match &p.outcome {
                    Pull::Queued => "cancel queued".to_string(),
                    Pull::AlreadyQueued => "cancel already queued".to_string(),
                    Pull::NotQueued(why) => {
                        failed += 1;
                        format!("NOT QUEUED: {why}")
                    }
                };
                outln!(
                    "pull {} {}: {what}{}",
                    p.account_id,
                    p.order_id,
                    p.action_id
                        .as_deref()
                        .map(|a| format!(" ({a})"))
                        .unwrap_or_default()
                );
            }
            if !opts.keep_working {
                let now = engaged
                    .pulled
                    .iter()
                    .filter(|p| p.outcome == Pull::Queued)
                    .count();
                outln!(
                    "working orders pulled: {} ({now} cancel(s) queued now, {} queued before, {failed} not queued)",
                    engaged.pulled.len(),
                    engaged.pulled.len() - now - failed
                );
            }
            let mut unflattened = 0;
            for f in &engaged.flattened {
                let order = format!(
                    "{} {} limit {}",
                    f.side,
                    f.position.unsigned_abs(),
                    f.limit_price.map(|p| p.to_string()).unwrap_or_default()
                );
                let what = match &f.outcome {
                    Pull::Queued => format!("{order} queued"),
                    Pull::AlreadyQueued => format!("{order} already queued"),
                    Pull::NotQueued(why) => {
                        unflattened += 1;
                        format!("NOT FLATTENED: {why}")
                    }
                };
                outln!(
                    "flatten {} {} {:+}: {what}{}",
                    f.account_id,
                    f.symbol,
                    f.position,
                    f.action_id
                        .as_deref()
                        .map(|a| format!(" ({a})"))
                        .unwrap_or_default()
                );
            }
            if opts.flatten {
                let now = engaged
                    .flattened
                    .iter()
                    .filter(|f| f.outcome == Pull::Queued)
                    .count();
                outln!(
                    "open positions: {} ({now} closing order(s) queued now, {} queued before, {unflattened} not flattened)",
                    engaged.flattened.len(),
                    engaged.flattened.len() - now - unflattened
                );
            }
            let mut problems = Vec::new();
            if failed > 0 {
                problems.push(format!("{failed} working order(s) could not be pulled"));
            }
            if unflattened > 0 {
                problems.push(format!("{unflattened} open position(s) were not flattened"));
            }
            if !problems.is_empty() {
                return Err(format!(
                    "the kill switch is engaged, but {}; see above, and run `airlock kill-switch engage` again once the cause is fixed",
                    problems.join(" and ")
                ));
            }
        }
        "release" => print_control(&ks.release(&who()).await.map_err(api_error)?),
        _ => {
            let st = ks.status().await.map_err(api_error)?;
            print_control(&st.control);
            if let Some(e) = &st.control.engagement {
                outln!(
                    "last engagement {} at {} by {}",
                    e.id,
                    human_time(e.at),
                    e.by
                );
                outln!(
                    "cancels: pending={} done={} failed={}",
                    st.cancels.pending,
                    st.cancels.done,
                    st.cancels.failed
                );
                outln!(
                    "flattening: pending={} done={} failed={}",
                    st.flattening.pending,
                    st.flattening.done,
                    st.flattening.failed
                );
                for (action_id, order_id, why) in &st.failures {
                    outln!("failed {order_id} ({action_id}): {why}");
                }
            }
        }
    }
    Ok(())
}
