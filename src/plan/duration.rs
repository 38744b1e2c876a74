//! Durations and integers as people write them in a config file: `"500ms"`, `"1m30s"`, `"1.5s"`
//! or whole seconds, and integers of any size. A value too large for what it configures is
//! reported as written (`5000000d`, `99999999999999999999`) beside the largest accepted, in the
//! unit the user wrote, never in nanoseconds or as a type mistake.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Visitor};

/// What the error for a value of the wrong type says a duration is.
pub(crate) const EXPECTED_DURATION: &str =
    "a duration: whole seconds (60) or text (\"1m30s\", \"1.5s\", \"1h 30m\")";

/// The units a duration may be written in, with their length in nanoseconds, longest first.
const UNITS: [(&str, u64); 9] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("min", 60_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("ns", 1),
];

/// A duration as written: whole seconds (`60`) or text (`"1m30s"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawDuration {
    /// An integer: whole seconds (kept at any size, so a too-long one is named as written).
    Seconds(i128),
    /// A string such as `"1m30s"`.
    Text(String),
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED_DURATION)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(i128::try_from(v).unwrap_or(i128::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a written duration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not a duration, zero, negative, or a fraction of a nanosecond.
    NotPositive,
    /// Longer than `max`: the message names the value and `max` in the unit written.
    TooLong {
        /// The value as written (`"5000000d"`, or `"9999999999s"` for whole seconds).
        written: String,
        /// The longest accepted, rounded down, in the smallest unit written (`"53375d"`).
        max: String,
    },
}

impl RawDuration {
    /// The duration, positive and at most `max`.
    pub(crate) fn to_duration(&self, max: Duration) -> Result<Duration, DurationError> {
        let (ns, unit, written) = match self {
            RawDuration::Seconds(s) if *s > 0 => (
                u128::try_from(*s)
                    .unwrap_or(0)
                    .saturating_mul(1_000_000_000),
                ("s", 1_000_000_000),
                format!("{s}s"),
            ),
            RawDuration::Seconds(_) => return Err(DurationError::NotPositive),
            RawDuration::Text(t) => {
                let (ns, unit) = parse_written(t).ok_or(DurationError::NotPositive)?;
                (ns, unit, t.trim().to_string())
            }
        };
        if ns == 0 {
            return Err(DurationError::NotPositive);
        }
        if ns > max.as_nanos() {
            let (name, unit_ns) = unit;
            return Err(DurationError::TooLong {
                written,
                max: format!("{}{name}", max.as_nanos() / u128::from(unit_ns)),
            });
        }
        Ok(Duration::from_nanos(
            u64::try_from(ns).expect("at most max, a Duration of u64 nanoseconds"),
        ))
    }
}

/// Parses `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"1d"`, `"250us"`, `"10ns"`, sums of them
/// (`"1m30s"`, `"1h 30m"`) and fractions (`"1.5s"`, `"0.25h"`), in exact integer nanoseconds:
/// `None` for anything else, a fraction of a nanosecond, or a sum past `u64::MAX` ns.
#[cfg(any(test, feature = "http"))]
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let (ns, _) = parse_written(text)?;
    u64::try_from(ns).ok().map(Duration::from_nanos)
}

/// The nanoseconds a text duration stands for (saturated at `u128::MAX`, so a huge one is still
/// "too long" rather than "not a duration") and the smallest unit written in it.
fn parse_written(text: &str) -> Option<(u128, (&'static str, u64))> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    let mut smallest = UNITS[0];
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == ' ')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let &(name, ns_per) = UNITS.iter().find(|(name, _)| *name == unit)?;
        if ns_per < smallest.1 {
            smallest = (name, ns_per);
        }
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || frac.contains('.') {
            return None;
        }
        // Digits past u128 saturate: such a value is too long whatever it configures.
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().unwrap_or(u128::MAX)
        };
        let mut ns = whole.saturating_mul(u128::from(ns_per));
        if !frac.is_empty() {
            // The fraction's digits over 10^len, times the unit: whole nanoseconds only.
            let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
            let num = frac.parse::<u128>().ok()?.checked_mul(u128::from(ns_per))?;
            if num % scale != 0 {
                return None;
            }
            ns = ns.saturating_add(num / scale);
        }
        total = total.saturating_add(ns);
        rest = tail.trim_start();
    }
    Some((total, smallest))
}

/// An integer as written: TOML integers past `i64` arrive as `i128`, kept so that a too-large
/// limit is named beside the largest accepted rather than refused as a type mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Int(pub(crate) i128);

impl Int {
    /// The value as a `u64`, saturated (the quota's own checks then name the maximum).
    pub(crate) fn saturated(self) -> u64 {
        u64::try_from(self.0.max(0)).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for Int {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int(v.into()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<Int, E> {
                Ok(Int(i128::try_from(v).unwrap_or(i128::MAX)))
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration as a config file writes it: a whole number of the largest unit that divides it
/// (`"1d"`, `"90s"`, `"1500ms"`), which [`RawDuration::to_duration`] reads back exactly.
pub(crate) fn written(d: Duration) -> String {
    let ns = d.as_nanos();
    let (name, unit) = UNITS
        .iter()
        .filter(|(name, _)| !matches!(*name, "min" | "µs"))
        .find(|(_, unit)| ns % u128::from(*unit) == 0)
        .expect("every duration is whole nanoseconds");
    format!("{}{name}", ns / u128::from(*unit))
}
