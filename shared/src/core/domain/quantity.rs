//! Whole numbers as clients send them: a quantity of contracts, counts and seconds.

use serde::{Deserialize, Serialize};

/// A number of contracts, always >= 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Quantity(u32);

impl Quantity {
    pub const MAX: u32 = 1_000_000;

    pub fn new(n: i64) -> Result<Self, String> {
        if n < 1 {
            Err("quantity must be a whole number of contracts, at least 1".into())
        } else if n > Self::MAX as i64 {
            Err(format!("quantity must be at most {}", Self::MAX))
        } else {
            Ok(Quantity(n as u32))
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let n = match &v {
            serde_json::Value::Number(n) => whole_number(n)
                .ok_or_else(|| serde::de::Error::custom("quantity must be a whole number"))?,
            _ => {
                return Err(serde::de::Error::custom(
                    "quantity must be a JSON integer (number of contracts)",
                ))
            }
        };
        Quantity::new(n).map_err(serde::de::Error::custom)
    }
}

/// A JSON number that is a whole number, as JSON Schema's `integer` counts them: `2` and
/// `2.0` alike (a client's JSON library may print either).
pub fn whole_number(n: &serde_json::Number) -> Option<i64> {
    n.as_i64().or_else(|| {
        let x = n.as_f64()?;
        (x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15).then_some(x as i64)
    })
}

/// Deserializes an optional whole number of seconds or items (`2` or `2.0`).
pub fn optional_whole_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<serde_json::Number>::deserialize(d)? {
        None => Ok(None),
        Some(n) => whole_number(&n)
            .and_then(|v| u32::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom("must be a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantity_rejects_zero_fractions_and_strings() {
        assert!(serde_json::from_str::<Quantity>("0").is_err());
        assert!(serde_json::from_str::<Quantity>("1.5").is_err());
        assert!(serde_json::from_str::<Quantity>("\"2\"").is_err());
        assert_eq!(serde_json::from_str::<Quantity>("2").unwrap().get(), 2);
    }
}
