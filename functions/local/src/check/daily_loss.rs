//! The daily loss scenario: the account's P&L on the CME trading day in `GET /portfolio`
//! (`day_pnl`), its documented fields, and figures that agree with each other and with
//! the limit: total = realized + unrealized, remaining = the limit less the day's loss
//! (never below 0), close-only exactly when the loss reaches the limit.

use std::time::Instant;

use airlock::core::domain::Price;
use serde_json::Value;

use super::client::Ctx;
use super::contract::fields;
use super::{Found, Outcome, Report};

pub(super) async fn daily_loss(ctx: &Ctx, report: &mut Report, found: &Found) {
    scenario!(report, "daily loss budget (portfolio day_pnl)", async {
        let account = found.account.clone().ok_or("no account to read")?;
        let a = ctx.get(&format!("/portfolio?account_id={account}")).await?;
        a.expect(200)?;
        figures(&a.body["day_pnl"])
    });
}

fn amount(d: &Value, key: &str) -> Result<Price, String> {
    let text = d[key]
        .as_str()
        .ok_or_else(|| format!("day_pnl.{key} is not decimal text: {}", d[key]))?;
    Price::parse(text).map_err(|e| format!("day_pnl.{key} {text:?}: {e}"))
}

/// Checks `day_pnl` and describes it.
fn figures(d: &Value) -> Outcome {
    fields(
        d,
        "day_pnl",
        &[
            "trading_day",
            "realized",
            "unrealized",
            "total",
            "max_daily_loss",
            "remaining",
            "close_only",
            "unpriced",
        ],
    )?;
    let day = d["trading_day"].as_str().unwrap_or("");
    chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .map_err(|_| format!("day_pnl.trading_day {day:?} is not a date"))?;
    let (realized, unrealized, total) = (
        amount(d, "realized")?.value(),
        amount(d, "unrealized")?.value(),
        amount(d, "total")?.value(),
    );
    if realized + unrealized != total {
        return Err(format!(
            "day_pnl: realized {realized} + unrealized {unrealized} is not the total {total}"
        ));
    }
    let zero = Default::default();
    let loss = (-total).max(zero);
    let close_only = d["close_only"]
        .as_bool()
        .ok_or("day_pnl.close_only is not a boolean")?;
    let budget = match d["max_daily_loss"] {
        Value::Null => {
            if close_only || !d["remaining"].is_null() {
                return Err("day_pnl: no limit, yet close_only or a remaining budget".into());
            }
            "no daily loss limit".to_string()
        }
        _ => {
            let limit = amount(d, "max_daily_loss")?.value();
            let remaining = amount(d, "remaining")?.value();
            if remaining != (limit - loss).max(zero) {
                return Err(format!(
                    "day_pnl: remaining {remaining} is not the limit {limit} less the loss {loss}"
                ));
            }
            if close_only != (loss >= limit) {
                return Err(format!(
                    "day_pnl: close_only {close_only} with a loss of {loss} and a limit of {limit}"
                ));
            }
            format!(
                "{} of {} USD left{}",
                d["remaining"].as_str().unwrap_or(""),
                d["max_daily_loss"].as_str().unwrap_or(""),
                if close_only { ", close-only" } else { "" }
            )
        }
    };
    let text = |k: &str| d[k].as_str().unwrap_or("").to_string();
    Ok(format!(
        "trading day {day}: realized {}, unrealized {}, total {} USD; {budget}",
        text("realized"),
        text("unrealized"),
        text("total")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_figures_must_agree() {
        let ok = json!({"trading_day": "2026-11-24", "realized": "-3000.00",
                        "unrealized": "-7460.00", "total": "-10460.00",
                        "max_daily_loss": "10000.00", "remaining": "0.00",
                        "close_only": true, "unpriced": []});
        let d = figures(&ok).unwrap();
        assert!(d.contains("close-only") && d.contains("2026-11-24"), "{d}");
        let mut bad = ok.clone();
        bad["total"] = json!("-10000.00");
        assert!(figures(&bad).is_err());
        let mut bad = ok.clone();
        bad["close_only"] = json!(false);
        assert!(figures(&bad).is_err());
        let mut bad = ok.clone();
        bad["remaining"] = json!("5.00");
        assert!(figures(&bad).is_err());
        let open = json!({"trading_day": "2026-11-24", "realized": "0.00",
                          "unrealized": "-660.00", "total": "-660.00",
                          "max_daily_loss": null, "remaining": null,
                          "close_only": false, "unpriced": []});
        assert!(figures(&open).unwrap().contains("no daily loss limit"));
        assert!(figures(&json!({})).is_err());
    }
}
