//! Times: milliseconds since the epoch, and their RFC 3339 text.

use std::fmt;

use serde::Serialize;

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
}
