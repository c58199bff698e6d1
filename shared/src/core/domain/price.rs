//! Prices: finite decimals, read exactly from a client's number or text and always printed
//! as text.

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// A reference price and when it was observed (`None`: a price stored before prices
/// carried their time, of unknown age).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quote {
    pub price: Price,
    pub observed_at: Option<super::Millis>,
}

impl Quote {
    /// How old the quote is at `now`, in whole seconds (a quote stamped ahead of `now` by
    /// another process's clock is 0 s old); `None`: its time is unknown.
    pub fn age_seconds(&self, now: super::Millis) -> Option<i64> {
        self.observed_at.map(|t| (now - t).max(0) / 1000)
    }
}

/// A finite decimal price. Accepts a JSON number or a decimal string on input and always
/// prints as a decimal string. Negative prices are valid numbers; policy decides if they trade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Price(Decimal);

impl Price {
    pub fn new(d: Decimal) -> Self {
        Price(d.normalize())
    }
    pub fn value(self) -> Decimal {
        self.0
    }
    /// Whether the price is a whole multiple of `tick`.
    pub fn on_tick(self, tick: Decimal) -> bool {
        !tick.is_zero() && (self.0 % tick).is_zero()
    }
    /// Decimal text as Airlock prints and stores it (any `Decimal`, up to 32 characters).
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.is_empty()
            || t.len() > 32
            || !t
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == '-' || c == '+')
        {
            return Err("price must be a decimal number such as \"68.45\"".into());
        }
        Decimal::from_str(t)
            .map(Price::new)
            .map_err(|_| "price must be a decimal number such as \"68.45\"".into())
    }

    /// A price as a client sends it in text: an optional sign, 1 to 12 digits, and
    /// optionally `.` and 1 to 16 more (or `.` and 1 to 16 digits alone); nothing else, not
    /// even spaces. The same grammar as the published schema ([`PRICE_TEXT_PATTERN`]).
    pub fn parse_input(s: &str) -> Result<Self, String> {
        let bad = || "price must be a decimal number such as \"68.45\"".to_string();
        let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
        let (int, frac) = match unsigned.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (unsigned, None),
        };
        let digits = |t: &str, max: usize| t.len() <= max && t.bytes().all(|b| b.is_ascii_digit());
        let ok = digits(int, 12)
            && match frac {
                None => !int.is_empty(),
                Some(f) => !f.is_empty() && digits(f, 16),
            };
        if !ok {
            return Err(bad());
        }
        Decimal::from_str(s).map(Price::new).map_err(|_| bad())
    }

    /// A price sent as a JSON number: finite, 0 or of magnitude 1e-11 to 1e12 (the range the
    /// schema publishes), read exactly from its shortest decimal text.
    fn from_json_number(n: &serde_json::Number) -> Result<Self, String> {
        let bad = || {
            format!("a price given as a number must be 0 or of magnitude {MIN_PRICE_NUMBER:e} to {MAX_PRICE_NUMBER:e}")
        };
        let x = n.as_f64().ok_or_else(bad)?;
        if !(x == 0.0 || (MIN_PRICE_NUMBER..=MAX_PRICE_NUMBER).contains(&x.abs())) {
            return Err(bad());
        }
        let text = n.to_string();
        let d = if text.contains(['e', 'E']) {
            Decimal::from_scientific(&text)
        } else {
            Decimal::from_str(&text)
        };
        d.map(Price::new).map_err(|_| bad())
    }
}

/// The grammar of a price sent as text (see [`Price::parse`]).
pub const PRICE_TEXT_PATTERN: &str = "^[+-]?(?:[0-9]{1,12}(?:\\.[0-9]{1,16})?|\\.[0-9]{1,16})$";
/// The smallest magnitude of a nonzero price sent as a JSON number.
pub const MIN_PRICE_NUMBER: f64 = 1e-11;
/// The largest magnitude of a price sent as a JSON number.
pub const MAX_PRICE_NUMBER: f64 = 1e12;

impl fmt::Display for Price {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always at least two decimals: "68.40", "-37.63", "70.00".
        let d = self.0;
        if d.scale() < 2 {
            let mut d2 = d;
            d2.rescale(2);
            write!(f, "{d2}")
        } else {
            write!(f, "{d}")
        }
    }
}

impl Serialize for Price {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A stored price (any decimal Airlock printed). Client input goes through
/// [`optional_input_price`], which holds it to the published grammar.
impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::Number(n) => Price::from_json_number(&n),
            serde_json::Value::String(s) => Price::parse(&s),
            _ => Err("price must be a JSON number or a decimal string".into()),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// An optional price in a client's request: a JSON number in the published range, or text
/// in the published grammar ([`Price::parse_input`]); `null` or absent is `None`.
pub fn optional_input_price<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Price>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None => Ok(None),
        Some(serde_json::Value::Number(n)) => Price::from_json_number(&n).map(Some),
        Some(serde_json::Value::String(s)) => Price::parse_input(&s).map(Some),
        Some(_) => Err("price must be a JSON number or a decimal string".into()),
    }
    .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use rust_decimal::Decimal;

    use super::*;

    #[test]
    fn price_reads_numbers_and_strings_exactly() {
        let p: Price = serde_json::from_str("68.45").unwrap();
        assert_eq!(p.to_string(), "68.45");
        let p: Price = serde_json::from_str("\"-37.63\"").unwrap();
        assert_eq!(p.to_string(), "-37.63");
        let p: Price = serde_json::from_str("70").unwrap();
        assert_eq!(p.to_string(), "70.00");
        assert!(serde_json::from_str::<Price>("\"1e5\"").is_err());
        assert!(serde_json::from_str::<Price>("true").is_err());
        assert!(Price::parse("68.45").unwrap().on_tick(Decimal::new(1, 2)));
        assert!(!Price::parse("68.455").unwrap().on_tick(Decimal::new(1, 2)));
    }
}
