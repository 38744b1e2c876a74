//! Header values and bodies: Unix seconds, RFC 3339, JSON strings, structured-field strings.
//! Integer arithmetic only.

const NS_PER_S: u64 = 1_000_000_000;

/// Whole seconds, rounded up: a client told to wait `ceil` seconds never retries too early.
pub(crate) fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(NS_PER_S)
}

/// `Retry-After` in seconds: rounded up, at least 1 (a denial always means "not now").
pub(crate) fn retry_after_secs(retry_after_ns: u64) -> u64 {
    ceil_secs(retry_after_ns).max(1)
}

/// The Unix second (rounded up) of the moment `after_ns` past `now` on a clock whose epoch is
/// `unix_epoch_ns`.
pub(crate) fn unix_secs_at(unix_epoch_ns: u64, now: u64, after_ns: u64) -> u64 {
    ceil_secs(unix_epoch_ns.saturating_add(now).saturating_add(after_ns))
}

/// Numbers below this have a static header value ([`header_num`]).
const SMALL: u64 = 10_000;

/// `0123456789101112...9999`: every number below [`SMALL`], written out one after another, so
/// a small number's header value is a slice of it.
const DIGITS: &str = match std::str::from_utf8(&digits()) {
    Ok(s) => s,
    Err(_) => panic!("digits are ASCII"),
};

/// How many bytes [`DIGITS`] takes: 10 one-digit numbers, 90 two-digit ones, and so on.
const DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9000 * 4;

const fn digits() -> [u8; DIGITS_LEN] {
    let mut out = [0u8; DIGITS_LEN];
    let (mut n, mut at) = (0u64, 0usize);
    while n < SMALL {
        let len = decimal_len(n);
        let (mut i, mut rest) = (len, n);
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += len;
        n += 1;
    }
    out
}

/// Decimal digits of `n` below [`SMALL`].
const fn decimal_len(n: u64) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n` as a header value: below 10,000 (limits and remaining counts, mostly) a slice of a
/// static string, which costs no allocation (an `X-RateLimit-*` value formatted per response
/// cost one each); above, formatted.
pub(crate) fn header_num(n: u64) -> http::HeaderValue {
    if n >= SMALL {
        return http::HeaderValue::from(n);
    }
    let len = decimal_len(n);
    // Where the numbers of `len` digits start, and the first of them.
    let (start, first) = match len {
        1 => (0, 0),
        2 => (10, 10),
        3 => (190, 100),
        _ => (2890, 1000),
    };
    let at = start + (n - first) as usize * len;
    http::HeaderValue::from_static(&DIGITS[at..at + len])
}

/// RFC 3339 UTC (`2024-01-01T12:00:00Z`) of a Unix second. Days to civil date by Howard
/// Hinnant's algorithm (exact for the proleptic Gregorian calendar).
///
/// ```text
/// 0 -> 1970-01-01T00:00:00Z, 1704067200 -> 2024-01-01T00:00:00Z
/// ```
pub(crate) fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// `text` as a structured-field string (RFC 8941 sf-string): printable ASCII only, `"` and `\`
/// escaped; anything else becomes `_` so the header stays valid whatever a config names.
pub(crate) fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// A period in words for the 429 message: "second", "minute", "hour", "day", "10 seconds",
/// "500 ms".
pub(crate) fn period_words(period_ns: u64) -> String {
    match period_ns {
        NS_PER_S => "second".into(),
        60_000_000_000 => "minute".into(),
        3_600_000_000_000 => "hour".into(),
        86_400_000_000_000 => "day".into(),
        p if p % 86_400_000_000_000 == 0 => format!("{} days", p / 86_400_000_000_000),
        p if p % 3_600_000_000_000 == 0 => format!("{} hours", p / 3_600_000_000_000),
        p if p % 60_000_000_000 == 0 => format!("{} minutes", p / 60_000_000_000),
        p if p % NS_PER_S == 0 => format!("{} seconds", p / NS_PER_S),
        p if p % 1_000_000 == 0 => format!("{} ms", p / 1_000_000),
        p => format!("{p} ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_num_writes_every_number() {
        for n in (0..=10_001).chain([99_999, 1_733_500_000, u64::MAX]) {
            assert_eq!(header_num(n).to_str().unwrap(), n.to_string(), "{n}");
        }
    }

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_704_067_200), "2024-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_704_110_400), "2024-01-01T12:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z"); // leap day of a /400 year
        assert_eq!(rfc3339(1_700_006_400), "2023-11-15T00:00:00Z");
        assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn rfc3339_matches_day_by_day_walk() {
        // Walk 200 years of days with a plain calendar and compare every first of the month.
        let mut days: u64 = 0;
        for y in 1970u64..2170 {
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let lens = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            for (m, len) in lens.iter().enumerate() {
                let want = format!("{y:04}-{:02}-01T00:00:00Z", m + 1);
                assert_eq!(rfc3339(days * 86_400), want);
                days += len;
            }
        }
    }

    #[test]
    fn rounding_and_escaping() {
        assert_eq!(ceil_secs(0), 0);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_secs(1_000_000_000), 1);
        assert_eq!(ceil_secs(1_000_000_001), 2);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(600_000_000), 1);
        assert_eq!(retry_after_secs(3_600_000_000_000), 3600);
        assert_eq!(
            unix_secs_at(1_700_000_000_000_000_000, 500_000_000, 0),
            1_700_000_001
        );
        assert_eq!(sf_string("pro \"x\"\\é"), "\"pro \\\"x\\\"\\\\_\"");
        assert_eq!(period_words(3_600_000_000_000), "hour");
        assert_eq!(period_words(10_000_000_000), "10 seconds");
        assert_eq!(period_words(500_000_000), "500 ms");
        assert_eq!(period_words(300_000_000_000), "5 minutes");
    }
}
