//! Domain types: accounts, orders, jobs, actions, CL contracts and the exchange calendar.
//!
//! Types here parse, they do not validate: a `Quantity` is always >= 1, a `Price` is
//! always a finite decimal, an `IdempotencyKey` is always 1..255 printable ASCII.

pub mod calendar;
pub mod cl;
pub mod fills;
pub mod payload;
pub mod portfolio;

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// Text a person or a log will read: no control characters (as JSON Schema, Unicode Cc).
pub const PRINTABLE_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

/// Milliseconds since the Unix epoch, UTC. Storage uses this; the API prints RFC 3339.
pub type Millis = i64;

/// RFC 3339 UTC with millisecond precision, e.g. `2026-11-21T14:05:10.123Z`.
pub fn rfc3339(ms: Millis) -> String {
    Rfc3339(ms).to_string()
}

/// A time as the API prints it ([`rfc3339`]), written where it goes: a view serializes it
/// from a buffer on the stack, with no `String` per time (an orders page has 100 of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339(pub Millis);

impl Rfc3339 {
    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`, for years 0 to 9999 (the days-to-date step is Howard
    /// Hinnant's `civil_from_days`); other years are written by chrono, as before.
    fn write(self, buf: &mut [u8; 24]) -> Option<&str> {
        let (days, ms_of_day) = (self.0.div_euclid(86_400_000), self.0.rem_euclid(86_400_000));
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        if !(0..=9999).contains(&year) {
            return None;
        }
        let mut put = |at: usize, width: usize, mut v: i64| {
            for b in buf[at..at + width].iter_mut().rev() {
                *b = b'0' + (v % 10) as u8;
                v /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, month);
        put(8, 2, day);
        put(11, 2, ms_of_day / 3_600_000);
        put(14, 2, ms_of_day / 60_000 % 60);
        put(17, 2, ms_of_day / 1_000 % 60);
        put(20, 3, ms_of_day % 1_000);
        for (at, c) in [
            (4, b'-'),
            (7, b'-'),
            (10, b'T'),
            (13, b':'),
            (16, b':'),
            (19, b'.'),
            (23, b'Z'),
        ] {
            buf[at] = c;
        }
        std::str::from_utf8(buf).ok()
    }
}

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 24];
        match self.write(&mut buf) {
            Some(s) => f.write_str(s),
            None => f.write_str(
                &chrono::DateTime::<chrono::Utc>::from_timestamp_millis(self.0)
                    .unwrap_or_default()
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            ),
        }
    }
}

impl Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 24];
        match self.write(&mut buf) {
            Some(text) => s.serialize_str(text),
            None => s.collect_str(self),
        }
    }
}

/// RFC 3339 UTC at second precision, for sentences read by people.
pub fn human_time(ms: Millis) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

macro_rules! string_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name { $(#[serde(rename = $text)] $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(format!(
                        "expected one of {}",
                        [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}

string_enum!(Side { Buy => "buy", Sell => "sell" });
string_enum!(OrderType { Market => "market", Limit => "limit", Stop => "stop", StopLimit => "stop_limit" });
string_enum!(TimeInForce { Day => "day", Gtc => "gtc", Ioc => "ioc", Fok => "fok" });
string_enum!(OrderStatus {
    Queued => "queued",
    Submitted => "submitted",
    Working => "working",
    PartiallyFilled => "partially_filled",
    Filled => "filled",
    Cancelled => "cancelled",
    Rejected => "rejected",
});
string_enum!(JobKind { PositionsSync => "positions.sync" });
string_enum!(JobStatus { Queued => "queued", Running => "running", Succeeded => "succeeded", Failed => "failed" });
string_enum!(AccountStatus { Active => "active", Suspended => "suspended", Closed => "closed" });
/// The action types, each with its normalized payload (`payload.rs`), the queue its work
/// travels on, and whether it can add risk (an order that may trade: the kill switch stops
/// it, a person confirms it by default). Generates [`ActionType`] and
/// [`payload::NormalizedPayload`]. This is the one list of them below the use cases; what
/// each type does is its module in `core::usecases::actions`, registered there.
macro_rules! action_types {
    ($($variant:ident => $text:literal, $payload:ty, $queue:ident, adds_risk: $risk:literal;)+) => {
        string_enum!(ActionType { $($variant => $text),+ });

        impl ActionType {
            pub fn queue_target(self) -> QueueTarget {
                match self { $(ActionType::$variant => QueueTarget::$queue),+ }
            }

            /// Whether an action of this type can add risk. One that can is stopped by the
            /// kill switch and confirmed by a person unless the policy says otherwise; a
            /// payload may still say that it does not ([`payload::Payload::adds_risk`]).
            pub fn can_add_risk(self) -> bool {
                match self { $(ActionType::$variant => $risk),+ }
            }
        }

        /// One normalized payload per action type. Stored and sent untagged: the variants
        /// cannot be mistaken for one another (each has a field the others lack, and a
        /// variant with every field of a later one is listed first).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
        #[serde(untagged)]
        pub enum NormalizedPayload { $($variant($payload)),+ }

        impl NormalizedPayload {
            pub fn action_type(&self) -> ActionType {
                match self { $(NormalizedPayload::$variant(_) => ActionType::$variant),+ }
            }

            /// The payload's own answers (account, message group, risk).
            pub fn payload(&self) -> &dyn payload::Payload {
                match self { $(NormalizedPayload::$variant(p) => p),+ }
            }
        }
    };
}

action_types! {
    OrderReplaceCl => "order.replace.cl", payload::NormalizedReplace, Orders, adds_risk: true;
    OrderSubmitCl => "order.submit.cl", payload::NormalizedOrder, Orders, adds_risk: true;
    OrderCancel => "order.cancel", payload::NormalizedCancel, Orders, adds_risk: false;
    PositionsSync => "positions.sync", payload::NormalizedSync, Jobs, adds_risk: false;
}
string_enum!(ActionStatus {
    Queued => "queued",
    Processing => "processing",
    Succeeded => "succeeded",
    Failed => "failed",
    Rejected => "rejected",
});
string_enum!(QueueTarget { Orders => "worker:orders", Jobs => "worker:jobs" });

impl QueueTarget {
    /// The queue's short name (`orders`, `jobs`): metric labels, `airlock queues`.
    pub fn short_name(self) -> &'static str {
        match self {
            QueueTarget::Orders => "orders",
            QueueTarget::Jobs => "jobs",
        }
    }
}

impl ActionStatus {
    /// `succeeded`, `failed` (and the reserved `rejected`): nothing will change any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ActionStatus::Succeeded | ActionStatus::Failed | ActionStatus::Rejected
        )
    }
}

impl OrderStatus {
    /// An order that may still trade: it counts against the position limit until it is
    /// filled, cancelled or rejected.
    pub fn is_open(self) -> bool {
        self.is_cancellable()
    }

    /// An order the broker has, or may have (claimed for it), that has not ended: what
    /// reconciliation asks the broker about.
    pub fn is_at_the_broker(self) -> bool {
        matches!(
            self,
            OrderStatus::Submitted | OrderStatus::Working | OrderStatus::PartiallyFilled
        )
    }

    /// An order that can still be cancelled at the broker.
    pub fn is_cancellable(self) -> bool {
        matches!(
            self,
            OrderStatus::Queued
                | OrderStatus::Submitted
                | OrderStatus::Working
                | OrderStatus::PartiallyFilled
        )
    }
}

impl Side {
    /// +1 for buy, -1 for sell: the sign an order adds to a position.
    pub fn sign(self) -> i64 {
        match self {
            Side::Buy => 1,
            Side::Sell => -1,
        }
    }
}

impl ActionType {
    /// A new order: its action creates an order record (checked against the position
    /// limit and the kill switch at the worker before the broker sees it).
    pub fn is_order_submission(self) -> bool {
        self.as_str().starts_with("order.submit.")
    }
}

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

/// Client-chosen idempotency key: 1..255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > 255 || !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            Err("idempotency_key must be 1 to 255 printable ASCII characters".into())
        } else {
            Ok(IdempotencyKey(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        IdempotencyKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Identifiers made by Airlock: a prefix and 26 random base32 characters after a time part,
/// so they sort roughly by creation time (`ord_01...`, `act_...`, `pln_...`).
pub fn new_id(prefix: &str, now: Millis) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    let mut s = String::with_capacity(prefix.len() + 1 + 22);
    s.push_str(prefix);
    s.push('_');
    let t = now.max(0) as u64;
    for i in (0..10).rev() {
        s.push(ALPHABET[((t >> (i * 5)) & 31) as usize] as char);
    }
    let mut rng = rand::thread_rng();
    for _ in 0..12 {
        s.push(ALPHABET[rng.gen_range(0..32)] as char);
    }
    s
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Account {
    pub account_id: String,
    pub name: String,
    pub desk: String,
    pub currency: String,
    pub status: AccountStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub account_id: String,
    pub symbol: String,
    pub quantity: i64,
    pub avg_price: Option<Price>,
    pub updated_at: Millis,
}

/// What an order trades and for whom: the same terms from the plan's normalized payload
/// through Airlock's order record to the broker's order. Flattened in JSON, so each of
/// those keeps its flat shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OrderTerms {
    pub account_id: String,
    pub symbol: String,
    pub side: Side,
    pub quantity: u32,
    pub order_type: OrderType,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
}

impl OrderTerms {
    /// The limit and stop prices the order carries, for the tick and band checks.
    pub fn prices(&self) -> impl Iterator<Item = Price> {
        [self.limit_price, self.stop_price].into_iter().flatten()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    #[serde(flatten)]
    pub terms: OrderTerms,
    pub status: OrderStatus,
    pub filled_quantity: u32,
    pub avg_fill_price: Option<Price>,
    pub action_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// 1 as submitted, one more with each replace of its terms.
    #[serde(default = "first_version")]
    pub version: u32,
    /// The terms of each earlier version, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<OrderVersion>,
}

/// An order's version before its first replace (and of a record stored without one).
pub fn first_version() -> u32 {
    1
}

/// An order's terms as they were up to a replace: what a replace may change (quantity,
/// prices, time in force), when it was replaced and by which action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrderVersion {
    pub version: u32,
    pub quantity: u32,
    pub limit_price: Option<Price>,
    pub stop_price: Option<Price>,
    pub time_in_force: TimeInForce,
    pub replaced_at: Millis,
    pub replaced_by: String,
}

impl Order {
    /// The order after a replace of its terms by `terms` (action `replaced_by`, at `at`):
    /// the next version, with the current terms kept last in `versions`. Status and fills
    /// stay; what a replace may not change (account, contract, side, type) is checked by
    /// [`Order::replace_error`].
    pub fn replaced(&self, terms: OrderTerms, replaced_by: &str, at: Millis) -> Order {
        let mut next = self.clone();
        next.versions.push(OrderVersion {
            version: self.version,
            quantity: self.terms.quantity,
            limit_price: self.terms.limit_price,
            stop_price: self.terms.stop_price,
            time_in_force: self.terms.time_in_force,
            replaced_at: at,
            replaced_by: replaced_by.to_string(),
        });
        next.terms = terms;
        next.version = self.version + 1;
        next.updated_at = at.max(self.updated_at);
        next
    }

    /// Why `next` is not a replace of `self` ([`Order::replaced`]): `None` when it is the
    /// same order (id, account, contract, side, type, creation, status, fills, action) at
    /// the next version, with `self`'s versions and its terms last among them.
    pub fn replace_error(&self, next: &Order) -> Option<String> {
        let (a, b) = (&self.terms, &next.terms);
        let why = if (
            &self.order_id,
            &a.account_id,
            &a.symbol,
            a.side,
            a.order_type,
        ) != (
            &next.order_id,
            &b.account_id,
            &b.symbol,
            b.side,
            b.order_type,
        ) {
            "a replace may not change the order's id, account, contract, side or type"
        } else if (
            self.created_at,
            self.status,
            self.filled_quantity,
            self.avg_fill_price,
        ) != (
            next.created_at,
            next.status,
            next.filled_quantity,
            next.avg_fill_price,
        ) || self.action_id != next.action_id
        {
            "a replace may not change the order's creation, status, fills or action"
        } else if next.version != self.version.saturating_add(1) {
            "a replace makes the next version"
        } else if next.versions.len() != self.versions.len() + 1
            || next.versions[..self.versions.len()] != self.versions[..]
            || next.versions.last().is_none_or(|v| {
                (
                    v.version,
                    v.quantity,
                    v.limit_price,
                    v.stop_price,
                    v.time_in_force,
                ) != (
                    self.version,
                    a.quantity,
                    a.limit_price,
                    a.stop_price,
                    a.time_in_force,
                )
            })
        {
            "a replace keeps every earlier version and adds the replaced terms"
        } else {
            return None;
        };
        Some(format!("order {}: {why}", self.order_id))
    }

    /// Contracts that may still trade: the unfilled rest of an open order, else 0.
    pub fn open_quantity(&self) -> i64 {
        if self.status.is_open() {
            (self.terms.quantity as i64 - self.filled_quantity as i64).max(0)
        } else {
            0
        }
    }
}

/// An account's exposure in one contract: its filled position and the contracts its open
/// orders (queued, submitted, working, partially filled) may still buy or sell. Position
/// limits hold against the worst case on each side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposure {
    pub position: i64,
    pub open_buy: i64,
    pub open_sell: i64,
}

impl Exposure {
    /// The position if every open buy fills and no open sell does.
    pub fn worst_long(&self) -> i64 {
        self.position.saturating_add(self.open_buy)
    }

    /// The position if every open sell fills and no open buy does.
    pub fn worst_short(&self) -> i64 {
        self.position.saturating_sub(self.open_sell)
    }

    /// Whether one more order on `side` leaves the worst case on that side within `bound`
    /// (before the order's own contracts are added): for a buy `worst_long <= bound`, for a
    /// sell `worst_short >= bound`.
    pub fn leaves_room(&self, side: Side, bound: i64) -> bool {
        match side {
            Side::Buy => self.worst_long() <= bound,
            Side::Sell => self.worst_short() >= bound,
        }
    }
}

/// A change of one account's exposure in one contract, applied as increments so that
/// concurrent writers (an execute reserving, a worker recording a fill) never conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposureDelta {
    pub account_id: String,
    pub symbol: String,
    pub position: i64,
    pub open_buy: i64,
    pub open_sell: i64,
    /// Orders of this contract claimed for the broker (`submitted`) and not yet recorded:
    /// +1 as an order is claimed, -1 as it leaves `submitted`. A sync does not replace
    /// the position while one is (the broker may hold a fill the order has not recorded).
    pub submitting: i64,
}

impl ExposureDelta {
    fn open(account_id: &str, symbol: &str, side: Side, open: i64, position: i64) -> Self {
        let (open_buy, open_sell) = match side {
            Side::Buy => (open, 0),
            Side::Sell => (0, open),
        };
        ExposureDelta {
            account_id: account_id.to_string(),
            symbol: symbol.to_string(),
            position,
            open_buy,
            open_sell,
            submitting: 0,
        }
    }

    /// A sync moving a position (no open quantity changes).
    pub fn position_moved(account_id: &str, symbol: &str, by: i64) -> Self {
        Self::open(account_id, symbol, Side::Buy, 0, by)
    }

    /// An accepted order's contracts, reserved at execute until the order ends.
    pub fn reserve(account_id: &str, symbol: &str, side: Side, quantity: i64) -> Self {
        Self::open(account_id, symbol, side, quantity, 0)
    }

    /// What an order's step from `prev` to `next` does to the exposure: a new fill moves
    /// contracts from open to the position; an order that ends releases its open rest.
    pub fn of_order_step(prev: &Order, next: &Order) -> Self {
        let filled = next.filled_quantity as i64 - prev.filled_quantity as i64;
        let submitting = |o: &Order| i64::from(o.status == OrderStatus::Submitted);
        Self {
            submitting: submitting(next) - submitting(prev),
            ..Self::open(
                &next.terms.account_id,
                &next.terms.symbol,
                next.terms.side,
                next.open_quantity() - prev.open_quantity(),
                next.terms.side.sign() * filled,
            )
        }
    }

    /// What creating `order` does to the exposure: the step from the order as execute
    /// reserved it (`queued`, nothing filled) to `order`. Creating it `queued` changes
    /// nothing; `submitted` claims it for the broker; `rejected` releases the reservation.
    pub fn of_order_created(order: &Order) -> Self {
        let reserved = Order {
            status: OrderStatus::Queued,
            filled_quantity: 0,
            avg_fill_price: None,
            ..order.clone()
        };
        Self::of_order_step(&reserved, order)
    }

    pub fn is_zero(&self) -> bool {
        self.position == 0 && self.open_buy == 0 && self.open_sell == 0 && self.submitting == 0
    }

    /// The change of the worst long (`position + open_buy`).
    pub fn worst_long(&self) -> i64 {
        self.position + self.open_buy
    }

    /// The change of the worst short (`position - open_sell`).
    pub fn worst_short(&self) -> i64 {
        self.position - self.open_sell
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: String,
    pub kind: JobKind,
    pub status: JobStatus,
    pub account_id: Option<String>,
    pub action_id: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub error: Option<String>,
    /// What the job did (a sync: the positions that changed).
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chrono_rfc3339(ms: Millis) -> String {
        chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
            .unwrap_or_default()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    }

    /// The stack-written time is chrono's text, exactly: at the edges (the epoch, leap
    /// days, centuries, years 0 and 9999 and just outside them, times out of chrono's
    /// range) and for any millisecond in and far beyond the years anyone trades in.
    #[test]
    fn rfc3339_is_chronos_text() {
        let day = 86_400_000_i64;
        let edges = [
            0,
            -1,
            1,
            day - 1,
            951_782_400_000,     // 2000-02-29
            4_107_542_400_000,   // 2100-03-01
            -62_167_219_200_000, // 0000-01-01
            -62_167_219_200_001, // -0001-12-31T23:59:59.999
            253_402_300_799_999, // 9999-12-31T23:59:59.999
            253_402_300_800_000, // 10000-01-01
            i64::MAX,
            i64::MIN,
        ];
        for ms in edges {
            let text = serde_json::to_string(&Rfc3339(ms)).unwrap();
            assert_eq!(text, format!("\"{}\"", chrono_rfc3339(ms)), "{ms}");
            assert_eq!(rfc3339(ms), chrono_rfc3339(ms), "{ms}");
        }
        use proptest::prelude::*;
        proptest!(ProptestConfig::with_cases(20_000), |(ms in -70_000_000_000_000_i64..260_000_000_000_000)| {
            prop_assert_eq!(rfc3339(ms), chrono_rfc3339(ms));
            prop_assert_eq!(serde_json::to_string(&Rfc3339(ms)).unwrap(), format!("\"{}\"", chrono_rfc3339(ms)));
        });
    }

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

    #[test]
    fn quantity_rejects_zero_fractions_and_strings() {
        assert!(serde_json::from_str::<Quantity>("0").is_err());
        assert!(serde_json::from_str::<Quantity>("1.5").is_err());
        assert!(serde_json::from_str::<Quantity>("\"2\"").is_err());
        assert_eq!(serde_json::from_str::<Quantity>("2").unwrap().get(), 2);
    }

    #[test]
    fn idempotency_key_bounds() {
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse(&"a".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("tab\there").is_err());
        assert!(IdempotencyKey::parse(&"a".repeat(255)).is_ok());
    }

    #[test]
    fn ids_sort_by_time() {
        let a = new_id("ord", 1_700_000_000_000);
        let b = new_id("ord", 1_700_000_000_001);
        assert!(a < b, "{a} < {b}");
        assert_eq!(a.len(), 4 + 22);
    }
}

/// An identifier sent by a client (account or order id): 1 to 64 characters of
/// letters, digits and `-_.:`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Ident(String);

impl Ident {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty()
            || s.len() > 64
            || !s
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
        {
            Err("must be 1 to 64 letters, digits or -_.:".into())
        } else {
            Ok(Ident(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Ident {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ident::parse(&s).map_err(serde::de::Error::custom)
    }
}

fn default_tif() -> TimeInForce {
    TimeInForce::Day
}

/// `order.submit.cl` payload, as sent. The symbol stays text: a bad symbol is a failed
/// `symbol_valid` check in the plan, not a malformed request.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderSubmitCl {
    pub account_id: Ident,
    /// The CL contract, e.g. `CLF27`. An unknown one is a failed `symbol_valid` check.
    #[schemars(length(max = 32), regex(pattern = crate::core::domain::PRINTABLE_PATTERN))]
    pub symbol: String,
    pub side: Side,
    pub quantity: Quantity,
    pub order_type: OrderType,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub limit_price: Option<Price>,
    #[serde(default, deserialize_with = "optional_input_price")]
    pub stop_price: Option<Price>,
    #[serde(default = "default_tif")]
    pub time_in_force: TimeInForce,
}

/// `order.cancel` payload.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderCancel {
    pub account_id: Ident,
    pub order_id: Ident,
}

/// `positions.sync` payload.
#[derive(Debug, Clone, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PositionsSync {
    pub account_id: Ident,
}

/// JSON Schemas of the domain's text and number types, as their parsers accept them (the
/// MCP tools publish them; the REST API's OpenAPI document will too).
mod schemas {
    use std::borrow::Cow;

    use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

    impl JsonSchema for super::Ident {
        fn schema_name() -> Cow<'static, str> {
            "Ident".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "type": "string", "minLength": 1, "maxLength": 64,
                "pattern": "^[A-Za-z0-9._:-]+$",
                "description": "An identifier: 1 to 64 letters, digits or -_.:"
            })
        }
    }

    impl JsonSchema for super::Quantity {
        fn schema_name() -> Cow<'static, str> {
            "Quantity".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "type": "integer", "minimum": 1, "maximum": 1000000,
                "description": "Whole contracts"
            })
        }
    }

    /// Inlined, so that each use takes the generator's side: what a request may send, or
    /// what a response prints (always a decimal string with at least two decimals).
    impl JsonSchema for super::Price {
        fn schema_name() -> Cow<'static, str> {
            "Price".into()
        }
        fn inline_schema() -> bool {
            true
        }
        fn json_schema(g: &mut SchemaGenerator) -> Schema {
            if *g.contract() == schemars::generate::Contract::Serialize {
                return json_schema!({
                    "type": "string", "pattern": "^-?[0-9]+\\.[0-9]{2,}$",
                    "description": "A decimal price in USD per barrel, as a string with at least two decimals"
                });
            }
            json_schema!({
                "anyOf": [
                    { "type": "string", "pattern": super::PRICE_TEXT_PATTERN },
                    { "const": 0 },
                    { "type": "number", "minimum": super::MIN_PRICE_NUMBER, "maximum": super::MAX_PRICE_NUMBER },
                    { "type": "number", "minimum": -super::MAX_PRICE_NUMBER, "maximum": -super::MIN_PRICE_NUMBER }
                ],
                "description": "A decimal price in USD per barrel: a string (\"68.45\") or a number on input, always a string on output; may be negative"
            })
        }
    }

    impl JsonSchema for super::IdempotencyKey {
        fn schema_name() -> Cow<'static, str> {
            "IdempotencyKey".into()
        }
        fn json_schema(_: &mut SchemaGenerator) -> Schema {
            json_schema!({
                "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$",
                "description": "1 to 255 printable ASCII characters"
            })
        }
    }
}
