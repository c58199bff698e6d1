//! The read scenarios: health, every read endpoint with its documented shape, and
//! pagination to the end.

use std::collections::HashSet;
use std::time::Instant;

use airlock::adapters::http_client::HttpRequest;

use super::client::Ctx;
use super::contract::{array, error_shape, fields, listing};
use super::market::cents;
use super::{Found, Outcome, Report, OPEN};

/// Pagination: the first pages use the small limit, the rest 200; at most this many pages.
const MAX_PAGES: usize = 100;
const SMALL_PAGES: usize = 5;

pub(super) async fn health(ctx: &Ctx, found: &mut Found) -> Outcome {
    let a = ctx
        .send(HttpRequest::get(format!("{}/health", ctx.root)), false)
        .await?;
    a.expect(200)?;
    fields(
        &a.body,
        "the health answer",
        &["status", "service", "version"],
    )?;
    if a.body["status"] != "ok" || a.body["service"] != "airlock" {
        return Err(format!("not Airlock's health answer: {}", a.text.trim()));
    }
    found.health = a.body.clone();
    Ok(format!(
        "{} {}, broker {}",
        a.body["service"].as_str().unwrap_or(""),
        a.body["version"].as_str().unwrap_or("?"),
        a.body["broker"].as_str().unwrap_or("not named")
    ))
}

pub(super) async fn reads(ctx: &Ctx, report: &mut Report, found: &mut Found) {
    scenario!(report, "read accounts", async {
        let rows = ctx
            .list(
                "/accounts",
                "accounts",
                &["account_id", "name", "desk", "currency", "status"],
            )
            .await?;
        if found.account.is_none() {
            found.account = rows
                .iter()
                .find(|r| r["status"] == "active")
                .or(rows.first())
                .and_then(|r| r["account_id"].as_str())
                .map(String::from);
        }
        Ok(format!(
            "{} accounts; checking {}",
            rows.len(),
            found
                .account
                .as_deref()
                .unwrap_or("none (no account visible)")
        ))
    });
    let filter = found
        .account
        .as_ref()
        .map(|a| format!("account_id={a}&"))
        .unwrap_or_default();

    scenario!(report, "read positions", async {
        let rows = ctx
            .list(
                &format!("/positions?{filter}limit=200"),
                "positions",
                &[
                    "account_id",
                    "symbol",
                    "quantity",
                    "avg_price",
                    "updated_at",
                ],
            )
            .await?;
        Ok(format!("{} positions", rows.len()))
    });

    scenario!(report, "read orders", async {
        let rows = ctx
            .list(
                &format!("/orders?{filter}limit=200"),
                "orders",
                &[
                    "order_id",
                    "account_id",
                    "symbol",
                    "side",
                    "quantity",
                    "order_type",
                    "limit_price",
                    "stop_price",
                    "time_in_force",
                    "status",
                    "filled_quantity",
                    "avg_fill_price",
                    "action_id",
                    "created_at",
                    "updated_at",
                ],
            )
            .await?;
        let open = rows
            .iter()
            .find(|o| OPEN.iter().any(|s| o["status"] == *s))
            .or(rows.first());
        found.order_id = open.and_then(|o| o["order_id"].as_str()).map(String::from);
        Ok(format!("{} orders", rows.len()))
    });

    scenario!(report, "read jobs", async {
        let rows = ctx
            .list(
                "/jobs?limit=200",
                "jobs",
                &[
                    "job_id",
                    "kind",
                    "status",
                    "account_id",
                    "action_id",
                    "created_at",
                    "updated_at",
                    "error",
                    "result",
                ],
            )
            .await?;
        Ok(format!("{} jobs", rows.len()))
    });

    scenario!(report, "read portfolio", async {
        let account = found.account.clone().ok_or("no account to read")?;
        let a = ctx.get(&format!("/portfolio?account_id={account}")).await?;
        a.expect(200)?;
        let b = &a.body;
        fields(
            b,
            "the portfolio",
            &["account_id", "positions", "totals", "as_of", "price_source"],
        )?;
        fields(
            &b["totals"],
            "totals",
            &[
                "gross_notional",
                "net_notional",
                "net_contracts",
                "unrealized_pnl",
                "unpriced_positions",
            ],
        )?;
        for p in array(b, "positions")? {
            fields(
                p,
                "a valued position",
                &[
                    "symbol",
                    "contract_month",
                    "quantity",
                    "reference_price",
                    "notional",
                    "unrealized_pnl",
                ],
            )?;
            if let (Some(s), Some(m), Some(r)) = (
                p["symbol"].as_str(),
                p["contract_month"].as_str(),
                p["reference_price"].as_str(),
            ) {
                found.priced.push((s.into(), m.into(), r.into()));
            }
        }
        found.today = b["as_of"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.date_naive());
        Ok(format!(
            "{} positions, gross notional {}, as of {}",
            array(b, "positions")?.len(),
            b["totals"]["gross_notional"].as_str().unwrap_or("?"),
            b["as_of"].as_str().unwrap_or("?")
        ))
    });

    scenario!(report, "read portfolio/allocation", async {
        let a = ctx.get("/portfolio/allocation").await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the allocation",
            &["by_contract_month", "by_side", "by_desk"],
        )?;
        for list in ["by_contract_month", "by_side", "by_desk"] {
            let slices = array(&a.body, list)?;
            let mut total = 0;
            for s in slices {
                fields(s, "a slice", &["key", "gross_notional", "percent"])?;
                total += s["percent"].as_str().and_then(cents).unwrap_or(0);
            }
            if !slices.is_empty() && total != 10_000 {
                return Err(format!(
                    "{list}: percents sum to {}.{:02}, not 100.00",
                    total / 100,
                    total % 100
                ));
            }
        }
        Ok(format!(
            "{} contract months, {} desks",
            array(&a.body, "by_contract_month")?.len(),
            array(&a.body, "by_desk")?.len()
        ))
    });

    scenario!(report, "read portfolio/risk-flags", async {
        let account = found.account.clone().ok_or("no account to read")?;
        let a = ctx
            .get(&format!("/portfolio/risk-flags?account_id={account}"))
            .await?;
        a.expect(200)?;
        fields(
            &a.body,
            "the risk flags",
            &["flags", "calendar_exposure", "trade_date", "policy_version"],
        )?;
        for f in array(&a.body, "flags")? {
            fields(f, "a flag", &["type", "severity", "message"])?;
        }
        if found.today.is_none() {
            found.today = a.body["trade_date"].as_str().and_then(|d| d.parse().ok());
        }
        Ok(format!(
            "{} flags, policy {}",
            array(&a.body, "flags")?.len(),
            a.body["policy_version"].as_str().unwrap_or("?")
        ))
    });

    scenario!(report, "read an unknown action", async {
        let a = ctx.get("/actions/act_airlock_check_unknown").await?;
        error_shape(&a, 404, "action_not_found", None)
    });
}

/// Follows `next_cursor` to the end: no row twice, no page over its limit, bounded pages.
pub(super) async fn paginate(ctx: &Ctx, path: &str, list: &str, id: &str, small: u32) -> Outcome {
    let mut seen = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut last_created: Option<String> = None;
    for page in 0..MAX_PAGES {
        let limit = if page < SMALL_PAGES { small } else { 200 };
        let url = match &cursor {
            Some(c) => format!("{path}limit={limit}&cursor={c}"),
            None => format!("{path}limit={limit}"),
        };
        let a = ctx.get(&url).await?;
        let rows = listing(&a, list, &[id]).map_err(|e| format!("page {}: {e}", page + 1))?;
        if rows.len() > limit as usize {
            return Err(format!(
                "page {} has {} rows, over its limit {limit}",
                page + 1,
                rows.len()
            ));
        }
        for r in rows {
            let key = r[id].as_str().unwrap_or_default().to_string();
            if !seen.insert(key.clone()) {
                return Err(format!("{key} appears twice (page {})", page + 1));
            }
            // Orders come newest first.
            if let Some(c) = r["created_at"].as_str().filter(|_| list == "orders") {
                if last_created.as_deref().is_some_and(|l| c > l) {
                    return Err(format!("{key} is out of order (newest first)"));
                }
                last_created = Some(c.to_string());
            }
        }
        match a.body["next_cursor"].as_str() {
            None => {
                return Ok(format!("{} {list} in {} pages", seen.len(), page + 1));
            }
            Some(c) => cursor = Some(c.to_string()),
        }
    }
    Ok(format!(
        "{} {list}, no duplicates; stopped at the cap of {MAX_PAGES} pages",
        seen.len()
    ))
}
