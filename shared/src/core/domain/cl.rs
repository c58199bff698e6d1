//! NYMEX WTI Light Sweet Crude Oil futures (CL): symbols, last trade dates, listing horizon.
//!
//! Contract rules (NYMEX rulebook chapter 200, CME contract specifications):
//! * 1,000 barrels a contract, quoted in US dollars and cents per barrel, tick 0.01 USD
//!   (10.00 USD a contract).
//! * Month codes F G H J K M N Q U V X Z for January to December.
//! * Trading terminates 3 business days before the 25th calendar day of the month preceding
//!   the contract month. If the 25th is not a business day, trading terminates 4 business
//!   days before the 25th (3 business days before the business day preceding the 25th).
//!   Business days come from the [`ExchangeCalendar`].
//! * The expiring contract stops trading at 13:30 America/Chicago on its last trading day.
//! * Listed: the current year, the next ten calendar years and two more consecutive months
//!   (see [`ClContract::last_listed`]).

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, NaiveDate, NaiveTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::core::domain::calendar::{chicago_to_utc, ExchangeCalendar};

/// The product root of every symbol this module accepts.
pub const ROOT: &str = "CL";
/// Barrels of crude oil in one contract.
pub const CONTRACT_UNIT_BARRELS: u32 = 1_000;
/// Month codes, January to December.
pub const MONTH_CODES: [char; 12] = ['F', 'G', 'H', 'J', 'K', 'M', 'N', 'Q', 'U', 'V', 'X', 'Z'];
/// The years a symbol may name: two-digit years map to 2000 + yy, so both forms cover the
/// same range and every contract has exactly one canonical symbol.
pub const YEARS: std::ops::RangeInclusive<i32> = 2000..=2099;
/// The expiring contract stops trading at this Chicago time on its last trading day.
pub const TRADING_STOPS_CT: (u32, u32) = (13, 30);

/// Minimum price fluctuation: 0.01 USD per barrel.
pub fn tick_size() -> Decimal {
    Decimal::new(1, 2)
}

/// Value of one tick for one contract: 0.01 USD x 1,000 barrels = 10.00 USD.
pub fn tick_value_usd() -> Decimal {
    Decimal::new(1000, 2)
}

/// A CL contract month, e.g. January 2027 (`CLF27`). Orders by expiry (year, then month).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClContract {
    year: i32,
    month: u32,
}

/// Why a string is not a CL symbol. `Display` gives a sentence saying what to send instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SymbolError {
    /// The symbol was empty.
    Empty,
    /// Not a symbol at all: non-ASCII, punctuation or spaces before the year, or too long.
    NotASymbol { input: String },
    /// Letters and digits, but not starting with `CL` (e.g. `NGF27`).
    WrongRoot { input: String },
    /// `CL` with no month code (e.g. `CL`, `CL27`).
    MissingMonth { input: String },
    /// A letter that is not one of F G H J K M N Q U V X Z (e.g. `CLA27`).
    BadMonthCode { input: String, code: char },
    /// A month code with no year (e.g. `CLF`).
    MissingYear { input: String, month_code: char },
    /// A one-digit year (e.g. `CLF7`): ambiguous, because CL lists ten years out.
    OneDigitYear {
        input: String,
        month_code: char,
        digit: char,
    },
    /// A year that is not two or four digits (e.g. `CLF202`, `CLFX27`).
    BadYear { input: String, month_code: char },
    /// A four-digit year outside 2000..=2099 (e.g. `CLF1999`).
    YearOutOfRange { input: String, year: i32 },
    /// Something after the year (e.g. `CLF27X`, `CLF27 `).
    TrailingCharacters { input: String, trailing: String },
}

impl fmt::Display for SymbolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const EXAMPLE: &str = "CL, a month code (F G H J K M N Q U V X Z for January to December) \
                               and a two- or four-digit year, e.g. CLF27 or CLF2027";
        match self {
            SymbolError::Empty => write!(f, "the symbol is empty; send {EXAMPLE}"),
            SymbolError::NotASymbol { input } => {
                write!(f, "{input} is not a CL symbol; send {EXAMPLE}")
            }
            SymbolError::WrongRoot { input } => write!(
                f,
                "{input} is not a CL (NYMEX WTI crude) symbol: symbols start with CL; send {EXAMPLE}"
            ),
            SymbolError::MissingMonth { input } => {
                write!(f, "{input} has no month code; send {EXAMPLE}")
            }
            SymbolError::BadMonthCode { input, code } => write!(
                f,
                "{input}: {code} is not a CL month code; use F G H J K M N Q U V X Z for \
                 January to December, e.g. CLF27 for January 2027"
            ),
            SymbolError::MissingYear { input, month_code: m } => {
                write!(f, "{input} has no year; send a two- or four-digit year, e.g. CL{m}27 or CL{m}2027")
            }
            SymbolError::OneDigitYear { input, month_code: m, digit: d } => write!(
                f,
                "{input} has a one-digit year, which is ambiguous because CL lists ten years out; \
                 send CL{m}2{d} or CL{m}202{d}"
            ),
            SymbolError::BadYear { input, month_code: m } => write!(
                f,
                "{input}: the year must be two or four digits right after the month code; \
                 send e.g. CL{m}27 or CL{m}2027"
            ),
            SymbolError::YearOutOfRange { input, year } => write!(
                f,
                "{input}: year {year} is outside {}..={}",
                YEARS.start(),
                YEARS.end()
            ),
            SymbolError::TrailingCharacters { input, trailing } => write!(
                f,
                "{input} has unexpected characters {trailing:?} after the year; send only \
                 CL, the month code and the year, e.g. CLF27"
            ),
        }
    }
}

impl std::error::Error for SymbolError {}

/// The input as shown in an error: as typed when it is short printable ASCII, otherwise
/// quoted with escapes and cut to 24 characters.
fn shown(input: &str) -> String {
    if input.len() <= 24 && input.bytes().all(|b| b.is_ascii_graphic()) {
        input.to_string()
    } else {
        let cut: String = input.chars().take(24).collect();
        let ellipsis = if cut.len() < input.len() { "..." } else { "" };
        format!("{cut:?}{ellipsis}")
    }
}

impl ClContract {
    /// The contract for `month` (1..=12) of `year` (2000..=2099).
    pub fn new(year: i32, month: u32) -> Option<ClContract> {
        (YEARS.contains(&year) && (1..=12).contains(&month)).then_some(ClContract { year, month })
    }

    /// Parses `CL` + month code + two- or four-digit year: `CLF27` or `CLF2027` (January
    /// 2027). Input is case-insensitive (`clf27` is `CLF27`); surrounding spaces are not
    /// trimmed and are an error. A two-digit year `yy` is 2000 + yy. A one-digit year (`CLF7`)
    /// is refused as ambiguous. The canonical form is [`ClContract::symbol`].
    pub fn parse(symbol: &str) -> Result<ClContract, SymbolError> {
        let input = shown(symbol);
        if symbol.is_empty() {
            return Err(SymbolError::Empty);
        }
        if symbol.len() > 16 || !symbol.is_ascii() {
            return Err(SymbolError::NotASymbol { input });
        }
        let upper = symbol.to_ascii_uppercase();
        let Some(rest) = upper.strip_prefix(ROOT) else {
            return Err(if upper.bytes().all(|b| b.is_ascii_alphanumeric()) {
                SymbolError::WrongRoot { input }
            } else {
                SymbolError::NotASymbol { input }
            });
        };
        let mut chars = rest.chars();
        let month_code = match chars.next() {
            None => return Err(SymbolError::MissingMonth { input }),
            Some(c) if c.is_ascii_digit() => return Err(SymbolError::MissingMonth { input }),
            Some(c) if !c.is_ascii_alphabetic() => return Err(SymbolError::NotASymbol { input }),
            Some(c) => c,
        };
        let Some(month) = MONTH_CODES.iter().position(|&m| m == month_code) else {
            return Err(SymbolError::BadMonthCode {
                input,
                code: month_code,
            });
        };
        let after_month = chars.as_str();
        let digits_len = after_month.bytes().take_while(u8::is_ascii_digit).count();
        let (digits, trailing) = after_month.split_at(digits_len);
        if digits.is_empty() {
            return Err(if trailing.is_empty() {
                SymbolError::MissingYear { input, month_code }
            } else {
                SymbolError::BadYear { input, month_code }
            });
        }
        if !trailing.is_empty() {
            // Report what follows the year as typed (the input is ASCII, so offsets agree).
            let trailing = symbol[symbol.len() - trailing.len()..].to_string();
            return Err(SymbolError::TrailingCharacters { input, trailing });
        }
        let number: i32 = digits.parse().map_err(|_| SymbolError::BadYear {
            input: input.clone(),
            month_code,
        })?;
        let year = match digits.len() {
            1 => {
                let digit = digits.chars().next().unwrap_or('0');
                return Err(SymbolError::OneDigitYear {
                    input,
                    month_code,
                    digit,
                });
            }
            2 => 2000 + number,
            4 => number,
            _ => return Err(SymbolError::BadYear { input, month_code }),
        };
        ClContract::new(year, month as u32 + 1).ok_or(SymbolError::YearOutOfRange { input, year })
    }

    pub fn year(&self) -> i32 {
        self.year
    }

    /// 1 = January .. 12 = December.
    pub fn month(&self) -> u32 {
        self.month
    }

    /// The month code, `F` for January .. `Z` for December.
    pub fn month_code(&self) -> char {
        MONTH_CODES[(self.month as usize).saturating_sub(1).min(11)]
    }

    /// The canonical symbol: upper case, two-digit year, e.g. "CLF27".
    pub fn symbol(&self) -> String {
        format!(
            "{ROOT}{}{:02}",
            self.month_code(),
            self.year.rem_euclid(100)
        )
    }

    /// The contract month as "YYYY-MM", e.g. "2027-01".
    pub fn contract_month(&self) -> String {
        format!("{:04}-{:02}", self.year, self.month)
    }

    /// The contract month after this one (`None` after CLZ99).
    pub fn next(&self) -> Option<ClContract> {
        if self.month == 12 {
            ClContract::new(self.year + 1, 1)
        } else {
            ClContract::new(self.year, self.month + 1)
        }
    }

    /// The 25th calendar day of the month preceding the contract month, the anchor of the
    /// last-trade-day rule.
    pub fn the_25th(&self) -> NaiveDate {
        let (y, m) = if self.month == 1 {
            (self.year - 1, 12)
        } else {
            (self.year, self.month - 1)
        };
        // Always valid: 1999..=2099, months 1..=12, day 25.
        NaiveDate::from_ymd_opt(y, m, 25).unwrap_or_default()
    }

    /// The last trading day: 3 business days before the 25th of the month preceding the
    /// contract month; if the 25th is not a business day, 4 business days before it (that
    /// is, 3 business days before the business day preceding the 25th).
    ///
    /// Either way exactly 3 business days follow it up to and including the 25th:
    /// `cal.business_days_between(ltd, the_25th) == 3` (two business days in between plus the
    /// 25th itself, or three in between when the 25th is not a business day).
    ///
    /// Outside the calendar's years (`cal.covers(..)` false) only weekends are skipped.
    pub fn last_trade_date(&self, cal: &ExchangeCalendar) -> NaiveDate {
        let the_25th = self.the_25th();
        let n = if cal.is_business_day(the_25th) { 3 } else { 4 };
        cal.business_days_before(the_25th, n)
    }

    /// The instant trading stops: 13:30 America/Chicago on the last trading day.
    pub fn trading_stops_at(&self, cal: &ExchangeCalendar) -> DateTime<Utc> {
        let (h, m) = TRADING_STOPS_CT;
        let local = self
            .last_trade_date(cal)
            .and_time(NaiveTime::from_hms_opt(h, m, 0).unwrap_or_default());
        // 13:30 is never skipped or repeated by a DST switch, so this always converts; the
        // fallback (13:30 read as UTC) is unreachable and exists only to avoid a panic.
        chicago_to_utc(local).unwrap_or_else(|| local.and_utc())
    }

    /// The first contract still trading on `today` (its last trade date is today or later).
    pub fn front_month(today: NaiveDate, cal: &ExchangeCalendar) -> Option<ClContract> {
        let mut c = ClContract::new(today.year(), today.month())?;
        for _ in 0..3 {
            if c.last_trade_date(cal) >= today {
                return Some(c);
            }
            c = c.next()?;
        }
        None
    }

    /// The furthest contract listed on `today`. CME lists CL for "the current year and the
    /// next ten calendar years plus two additional consecutive contract months"; read here as
    /// December of (year + 10) plus January and February of (year + 11). On 2026-11-21 that
    /// is CLG37. (`None` past 2088, when the range would leave 2000..=2099.)
    pub fn last_listed(today: NaiveDate) -> Option<ClContract> {
        ClContract::new(today.year() + 11, 2)
    }

    /// Whether the contract is listed on `today` per the built-in CME calendar
    /// ([`ExchangeCalendar::cme`]): not expired (today is on or before its last trade date;
    /// on that day trading still stops at 13:30 CT, see [`ClContract::trading_stops_at`]) and
    /// inside the listed horizon. `Err` carries a sentence why not.
    pub fn listed_on(&self, today: NaiveDate) -> Result<(), String> {
        self.listed_on_with(today, ExchangeCalendar::cme())
    }

    /// [`ClContract::listed_on`] with a given calendar.
    pub fn listed_on_with(&self, today: NaiveDate, cal: &ExchangeCalendar) -> Result<(), String> {
        let ltd = self.last_trade_date(cal);
        if today > ltd {
            return Err(format!(
                "{} has expired: its last trading day was {ltd} (trading stopped at 13:30 CT)",
                self.symbol()
            ));
        }
        match ClContract::last_listed(today) {
            Some(last) if *self <= last => Ok(()),
            Some(last) => Err(format!(
                "{} is not listed yet: on {today} CL is listed out to {} (the current year, the \
                 next ten years and two more months)",
                self.symbol(),
                last.symbol()
            )),
            None => Err(format!(
                "{} is beyond the years this service handles",
                self.symbol()
            )),
        }
    }
}

impl fmt::Display for ClContract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.symbol())
    }
}

impl FromStr for ClContract {
    type Err = SymbolError;
    fn from_str(s: &str) -> Result<Self, SymbolError> {
        ClContract::parse(s)
    }
}

/// Serialized as the canonical symbol, e.g. "CLF27".
impl Serialize for ClContract {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.symbol())
    }
}

impl<'de> Deserialize<'de> for ClContract {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ClContract::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::domain::calendar::chicago_label;
    use crate::core::domain::calendar::tests::{cal, date};
    use proptest::prelude::*;

    fn cl(s: &str) -> ClContract {
        ClContract::parse(s).unwrap()
    }

    fn err(s: &str) -> String {
        ClContract::parse(s).unwrap_err().to_string()
    }

    #[test]
    fn contract_constants() {
        assert_eq!(CONTRACT_UNIT_BARRELS, 1_000);
        assert_eq!(tick_size().to_string(), "0.01");
        assert_eq!(
            tick_value_usd(),
            tick_size() * Decimal::from(CONTRACT_UNIT_BARRELS)
        );
    }

    #[test]
    fn clz26_last_trades_friday_2026_11_20() {
        let c = cl("CLZ26");
        assert_eq!(c.last_trade_date(cal()), date("2026-11-20"));
        assert_eq!(
            chicago_label(c.trading_stops_at(cal())),
            "13:30 CT on 2026-11-20"
        );
        assert_eq!(
            c.trading_stops_at(cal()).to_rfc3339(),
            "2026-11-20T19:30:00+00:00"
        );
    }

    #[test]
    fn clf27_last_trades_monday_2026_12_21_because_the_25th_is_christmas() {
        let c = cl("CLF27");
        assert!(!cal().is_business_day(c.the_25th()));
        assert_eq!(c.last_trade_date(cal()), date("2026-12-21"));
        assert_eq!(
            chicago_label(c.trading_stops_at(cal())),
            "13:30 CT on 2026-12-21"
        );
    }

    #[test]
    fn other_known_last_trade_dates() {
        // The 25th on a Saturday (April 2020: the negative-price CLK20 expiry).
        assert_eq!(cl("CLK20").last_trade_date(cal()), date("2020-04-21"));
        // The 25th on Memorial Day 2020.
        assert_eq!(cl("CLM20").last_trade_date(cal()), date("2020-05-19"));
        // Thanksgiving inside the window (2022-11-24).
        assert_eq!(cl("CLZ22").last_trade_date(cal()), date("2022-11-21"));
        // Christmas observed on Friday 2021-12-24 and the 25th a Saturday.
        assert_eq!(cl("CLF22").last_trade_date(cal()), date("2021-12-20"));
        // Good Friday 2035-03-23 is the business day before a Sunday 25th.
        assert_eq!(cl("CLJ35").last_trade_date(cal()), date("2035-03-19"));
        // Outside the table only weekends are skipped, and covers() says so: the 25th of
        // December 2044 is a Sunday, so 4 weekdays back, ignoring Christmas.
        let far = cl("CLF45").last_trade_date(cal());
        assert_eq!(far, date("2044-12-20"));
        assert!(!cal().covers(far));
        // Trading stops at 13:30 CT whatever the DST state: CST in December, CDT in June.
        assert_eq!(
            cl("CLF27").trading_stops_at(cal()).to_rfc3339(),
            "2026-12-21T19:30:00+00:00"
        );
        assert_eq!(
            cl("CLN26").trading_stops_at(cal()).to_rfc3339(),
            "2026-06-22T18:30:00+00:00"
        );
    }

    #[test]
    fn symbols_parse_and_canonicalise() {
        assert_eq!(cl("CLF27"), ClContract::new(2027, 1).unwrap());
        assert_eq!(cl("CLF2027"), cl("CLF27"));
        assert_eq!(cl("clf27"), cl("CLF27"));
        assert_eq!(cl("Clz2026"), cl("CLZ26"));
        assert_eq!(cl("CLZ00").year(), 2000);
        assert_eq!(cl("CLZ99").year(), 2099);
        let c = cl("clf2027");
        assert_eq!((c.year(), c.month()), (2027, 1));
        assert_eq!(c.symbol(), "CLF27");
        assert_eq!(c.to_string(), "CLF27");
        assert_eq!(c.contract_month(), "2027-01");
        assert_eq!(c.month_code(), 'F');
        assert_eq!(cl("CLV30").contract_month(), "2030-10");
        assert_eq!("CLX27".parse::<ClContract>().unwrap().month(), 11);
        assert!(cl("CLZ26") < cl("CLF27") && cl("CLF27") < cl("CLG27"));
        assert_eq!(serde_json::to_string(&cl("clf2027")).unwrap(), "\"CLF27\"");
        assert_eq!(
            serde_json::from_str::<ClContract>("\"clh28\"").unwrap(),
            cl("CLH28")
        );
        assert!(serde_json::from_str::<ClContract>("\"CLF7\"").is_err());
    }

    #[test]
    fn one_digit_year_is_refused_with_a_reason() {
        assert_eq!(
            err("CLF7"),
            "CLF7 has a one-digit year, which is ambiguous because CL lists ten years out; send CLF27 or CLF2027"
        );
        assert!(matches!(
            ClContract::parse("clh9"),
            Err(SymbolError::OneDigitYear {
                month_code: 'H',
                digit: '9',
                ..
            })
        ));
        assert!(err("clh9").contains("send CLH29 or CLH2029"));
    }

    #[test]
    fn other_bad_symbols_say_what_is_wrong() {
        assert!(matches!(ClContract::parse(""), Err(SymbolError::Empty)));
        assert!(err("").contains("empty"));
        assert_eq!(
            ClContract::parse("NGF27"),
            Err(SymbolError::WrongRoot {
                input: "NGF27".into()
            })
        );
        assert!(err("NGF27").starts_with("NGF27 is not a CL"));
        assert!(matches!(
            ClContract::parse("CL"),
            Err(SymbolError::MissingMonth { .. })
        ));
        assert!(matches!(
            ClContract::parse("CL27"),
            Err(SymbolError::MissingMonth { .. })
        ));
        assert!(err("CL27").contains("no month code"));
        assert_eq!(
            ClContract::parse("CLA27"),
            Err(SymbolError::BadMonthCode {
                input: "CLA27".into(),
                code: 'A'
            })
        );
        assert!(err("CLA27").contains("A is not a CL month code"));
        assert!(matches!(
            ClContract::parse("CLF"),
            Err(SymbolError::MissingYear { .. })
        ));
        assert!(err("CLF").contains("no year"));
        assert!(matches!(
            ClContract::parse("CLF202"),
            Err(SymbolError::BadYear { .. })
        ));
        assert!(matches!(
            ClContract::parse("CLF20270"),
            Err(SymbolError::BadYear { .. })
        ));
        assert!(matches!(
            ClContract::parse("CLFX27"),
            Err(SymbolError::BadYear { .. })
        ));
        assert!(err("CLF202").contains("two or four digits"));
        assert_eq!(
            ClContract::parse("CLF1999"),
            Err(SymbolError::YearOutOfRange {
                input: "CLF1999".into(),
                year: 1999
            })
        );
        assert!(err("CLF2100").contains("outside 2000..=2099"));
        assert_eq!(
            ClContract::parse("CLF27x"),
            Err(SymbolError::TrailingCharacters {
                input: "CLF27x".into(),
                trailing: "x".into()
            })
        );
        assert!(err("CLF27 ").contains("unexpected characters \" \" after the year"));
        assert!(err(" CLF27").contains("is not a CL symbol"));
        assert!(matches!(
            ClContract::parse("CL-F27"),
            Err(SymbolError::NotASymbol { .. })
        ));
        assert!(matches!(
            ClContract::parse("CLF27€"),
            Err(SymbolError::NotASymbol { .. })
        ));
        assert!(matches!(
            ClContract::parse("ČLF27"),
            Err(SymbolError::NotASymbol { .. })
        ));
        assert!(matches!(
            ClContract::parse(&"CLF27".repeat(50)),
            Err(SymbolError::NotASymbol { .. })
        ));
        // Long and control-character input is echoed quoted and cut short.
        let long = err(&format!("CLF27{}", "\n".repeat(100)));
        assert!(long.len() < 250, "{long}");
        assert!(long.starts_with("\"CLF27\\n"), "{long}");
        let e: Box<dyn std::error::Error> = Box::new(ClContract::parse("x").unwrap_err());
        assert!(!e.to_string().is_empty());
    }

    #[test]
    fn listing_horizon_and_expiry() {
        let today = date("2026-11-21");
        assert_eq!(ClContract::front_month(today, cal()), Some(cl("CLF27")));
        assert_eq!(
            ClContract::front_month(date("2026-11-20"), cal()),
            Some(cl("CLZ26"))
        );
        assert_eq!(
            ClContract::front_month(date("2026-12-22"), cal()),
            Some(cl("CLG27"))
        );
        assert_eq!(ClContract::last_listed(today), Some(cl("CLG37")));

        let e = cl("CLZ26").listed_on(today).unwrap_err();
        assert_eq!(
            e,
            "CLZ26 has expired: its last trading day was 2026-11-20 (trading stopped at 13:30 CT)"
        );
        assert_eq!(cl("CLZ26").listed_on(date("2026-11-20")), Ok(()));
        assert_eq!(cl("CLF27").listed_on(today), Ok(()));
        assert_eq!(cl("CLZ36").listed_on(today), Ok(()));
        assert_eq!(cl("CLG37").listed_on(today), Ok(()));
        let e = cl("CLH37").listed_on(today).unwrap_err();
        assert!(
            e.starts_with("CLH37 is not listed yet: on 2026-11-21 CL is listed out to CLG37"),
            "{e}"
        );
        assert!(cl("CLZ99").listed_on(date("2095-01-01")).is_err());
        assert!(cl("CLF27").listed_on(NaiveDate::MAX).is_err());
        assert!(cl("CLF27").listed_on(NaiveDate::MIN).is_err());
    }

    // ------------------------------------------------------------------- vector file

    #[derive(Deserialize)]
    struct Vectors {
        calendar_version: String,
        last_trade_dates: Vec<LtdVector>,
    }

    #[derive(Deserialize)]
    struct LtdVector {
        symbol: String,
        last_trade_date: String,
        trading_stops_at: String,
        the_25th: String,
        the_25th_is_business_day: bool,
    }

    #[test]
    fn last_trade_dates_match_every_vector() {
        let v: Vectors =
            serde_json::from_str(include_str!("../../../data/cl_vectors.json")).unwrap();
        assert_eq!(v.calendar_version, cal().version());
        assert!(v.last_trade_dates.len() >= 17 * 12);
        for lv in &v.last_trade_dates {
            let c = cl(&lv.symbol);
            assert_eq!(c.symbol(), lv.symbol);
            assert_eq!(c.the_25th().to_string(), lv.the_25th, "{}", lv.symbol);
            assert_eq!(
                cal().is_business_day(c.the_25th()),
                lv.the_25th_is_business_day,
                "{}",
                lv.symbol
            );
            assert_eq!(
                c.last_trade_date(cal()).to_string(),
                lv.last_trade_date,
                "{}",
                lv.symbol
            );
            let stops = DateTime::parse_from_rfc3339(&lv.trading_stops_at)
                .unwrap()
                .with_timezone(&Utc);
            assert_eq!(c.trading_stops_at(cal()), stops, "{}", lv.symbol);
        }
    }

    // ------------------------------------------------------------------- properties

    fn contract_2020_2036() -> impl Strategy<Value = ClContract> {
        (2020i32..=2036, 1u32..=12).prop_map(|(y, m)| ClContract::new(y, m).unwrap())
    }

    proptest! {
        #[test]
        fn last_trade_date_obeys_the_rule(c in contract_2020_2036()) {
            let ltd = c.last_trade_date(cal());
            let the_25th = c.the_25th();
            prop_assert!(cal().covers(ltd));
            prop_assert!(cal().is_business_day(ltd));
            prop_assert!(ltd < the_25th);
            prop_assert!(the_25th - ltd <= chrono::Duration::days(10));
            // Exactly 3 business days follow the last trade date up to and including the 25th.
            prop_assert_eq!(cal().business_days_between(ltd, the_25th), 3);
            // The expiring contract is trading on Globex one minute before it stops.
            let stop = c.trading_stops_at(cal());
            prop_assert!(cal().market_state(stop - chrono::Duration::minutes(1)).is_open());
            prop_assert_eq!(chicago_label(stop), format!("13:30 CT on {ltd}"));
        }

        #[test]
        fn symbols_round_trip(y in 2000i32..=2099, m in 1u32..=12) {
            let c = ClContract::new(y, m).unwrap();
            prop_assert_eq!(ClContract::parse(&c.symbol()), Ok(c));
            prop_assert_eq!(ClContract::parse(&c.symbol().to_lowercase()), Ok(c));
            let four = format!("CL{}{}", c.month_code(), y);
            prop_assert_eq!(ClContract::parse(&four), Ok(c));
        }

        #[test]
        fn parse_never_panics_on_anything(s in "\\PC{0,20}") {
            if let Err(e) = ClContract::parse(&s) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn parse_never_panics_on_symbol_like_input(s in "[cCnN][lLgG][A-Za-z0-9 ]{0,7}") {
            match ClContract::parse(&s) {
                Ok(c) => prop_assert_eq!(ClContract::parse(&c.symbol()), Ok(c)),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }

        #[test]
        fn listing_is_a_window(y in 2020i32..=2036, m in 1u32..=12, days in 0i64..4000) {
            let c = ClContract::new(y, m).unwrap();
            let today = date("2020-01-01") + chrono::Duration::days(days);
            let listed = c.listed_on(today).is_ok();
            let expected = today <= c.last_trade_date(cal())
                && c <= ClContract::last_listed(today).unwrap();
            prop_assert_eq!(listed, expected);
        }
    }
}
