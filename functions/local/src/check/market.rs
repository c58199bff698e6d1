//! The contracts and prices the scenarios plan with.

/// The contract to plan on: two months after the front month on `today` (never in the
/// close-only window), and one that expired two years ago (never executable).
pub(super) fn contracts(today: chrono::NaiveDate) -> (String, String) {
    use airlock::core::domain::calendar::ExchangeCalendar;
    use airlock::core::domain::cl::ClContract;
    use chrono::Datelike;
    let cal = ExchangeCalendar::cme();
    let tradeable = ClContract::front_month(today, cal)
        .and_then(|c| c.next())
        .and_then(|c| c.next())
        .map(|c| c.symbol())
        .unwrap_or_else(|| "CLF27".into());
    let code = b"FGHJKMNQUVXZ"[today.month0() as usize] as char;
    (tradeable, format!("CL{code}{}", today.year() - 2))
}

/// Cents of a decimal price string ("68.40" -> 6840); `None` for anything else.
pub(super) fn cents(price: &str) -> Option<i64> {
    let (whole, frac) = price.split_once('.').unwrap_or((price, ""));
    if frac.len() > 2 || whole.starts_with('-') {
        return None;
    }
    let frac = format!("{frac:0<2}");
    Some(whole.parse::<i64>().ok()? * 100 + frac.parse::<i64>().ok()?)
}

/// A buy limit 10 % under the reference price, on the cent: inside the default 20 % band,
/// far enough below the market to rest.
pub(super) fn resting_buy_limit(reference: &str) -> Option<String> {
    let c = cents(reference)?;
    if c < 100 {
        return None;
    }
    let limit = c * 9 / 10;
    Some(format!("{}.{:02}", limit / 100, limit % 100))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contracts_are_derived_from_the_date() {
        let d = |s: &str| s.parse::<chrono::NaiveDate>().unwrap();
        // CLZ26 stopped trading on 2026-11-19: the front month is CLF27.
        assert_eq!(
            contracts(d("2026-11-23")),
            ("CLH27".into(), "CLX2024".into())
        );
        assert_eq!(
            contracts(d("2027-01-05")),
            ("CLJ27".into(), "CLF2025".into())
        );
    }

    #[test]
    fn limits_rest_ten_percent_under_the_reference() {
        assert_eq!(resting_buy_limit("68.40").as_deref(), Some("61.56"));
        assert_eq!(resting_buy_limit("70").as_deref(), Some("63.00"));
        assert_eq!(resting_buy_limit("70.5").as_deref(), Some("63.45"));
        assert_eq!(resting_buy_limit("0.50"), None);
        assert_eq!(resting_buy_limit("-37.63"), None);
        assert_eq!(resting_buy_limit("1.234"), None);
        assert_eq!(cents("100.00"), Some(10_000));
    }
}
