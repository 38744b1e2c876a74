//! Plans from a TOML file shaped like the seeds' free / pro / enterprise tiers.
//!
//! ```toml
//! [plans.free]
//! limit = 100
//! window = 86400          # seconds, or a string: "500ms", "10s", "5m", "1h", "1d", "1m30s", "1.5s"
//! burst = 10
//! algorithm = "token_bucket"   # leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log
//!
//! [plans.pro]              # a compound plan: every limit must pass
//! strategy = "soft"        # hard (default), soft, queue (with max_delay), priority via headroom
//! limits = [ { limit = 10, window = "1s" }, { limit = 10000, window = "1d", burst = 100 } ]
//! ```
//!
//! Every mistake is an [`Error::Config`] that names the field and its line.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{MAX_PARTS, Plan, Strategy};
use crate::error::Error;
use crate::quota::{Algorithm, Quota};

/// Parsed plans, in file order; hand them to [`Builder::plans`](crate::Builder::plans).
///
/// ```
/// use tollgate::PlanConfig;
/// let config = PlanConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1d\"\nburst = 10\n").unwrap();
/// assert_eq!(config.names(), ["free"]);
/// let err = PlanConfig::parse("[plans.free]\nlimit = 0\nwindow = 60\n").unwrap_err();
/// assert_eq!(err.to_string(), "line 2: plans.free.limit: must be at least 1, got 0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    plans: Vec<(String, Plan)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    plans: std::collections::BTreeMap<String, Spanned<RawPlan>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    limit: Option<Spanned<i64>>,
    window: Option<Spanned<RawDuration>>,
    burst: Option<Spanned<i64>>,
    algorithm: Option<Spanned<String>>,
    strategy: Option<Spanned<String>>,
    max_delay: Option<Spanned<RawDuration>>,
    headroom: Option<Spanned<i64>>,
    limits: Option<Spanned<Vec<Spanned<RawLimit>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    limit: Option<Spanned<i64>>,
    window: Option<Spanned<RawDuration>>,
    burst: Option<Spanned<i64>>,
    algorithm: Option<Spanned<String>>,
}

#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum RawDuration {
    Seconds(i64),
    Text(String),
}

/// Line (1-based) of byte offset `at` in `src`.
pub(crate) fn line_of(src: &str, at: usize) -> usize {
    src.as_bytes()[..at.min(src.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A config source being read: turns a byte offset into the line an error names.
pub(crate) struct Ctx<'a> {
    pub(crate) src: &'a str,
}

impl Ctx<'_> {
    /// A config error naming `field` at byte offset `at`.
    pub(crate) fn err<T>(
        &self,
        at: usize,
        field: &str,
        message: impl std::fmt::Display,
    ) -> Result<T, Error> {
        Err(Error::Config {
            line: Some(line_of(self.src, at)),
            message: format!("{field}: {message}"),
        })
    }

    fn positive(&self, v: &Spanned<i64>, field: &str) -> Result<u64, Error> {
        match u64::try_from(*v.get_ref()) {
            Ok(n) if n >= 1 => Ok(n),
            _ => self.err(
                v.span().start,
                field,
                format!("must be at least 1, got {}", v.get_ref()),
            ),
        }
    }

    fn duration(&self, v: &Spanned<RawDuration>, field: &str) -> Result<Duration, Error> {
        let d = match v.get_ref() {
            RawDuration::Seconds(s) => u64::try_from(*s).ok().map(Duration::from_secs),
            RawDuration::Text(t) => parse_duration(t),
        };
        match d {
            Some(d) if !d.is_zero() => Ok(d),
            _ => self.err(
                v.span().start,
                field,
                "must be a positive duration: whole seconds, or a string like \"500ms\", \"10s\", \"5m\", \"1h\", \"1d\", \"1m30s\", \"1.5s\"",
            ),
        }
    }

    fn quota(
        &self,
        at: usize,
        path: &str,
        limit: Option<&Spanned<i64>>,
        window: Option<&Spanned<RawDuration>>,
        burst: Option<&Spanned<i64>>,
        algorithm: Option<&Spanned<String>>,
    ) -> Result<Quota, Error> {
        let Some(limit) = limit else {
            return self.err(at, path, "missing field `limit`");
        };
        let Some(window) = window else {
            return self.err(at, path, "missing field `window`");
        };
        let mut q = Quota::new(
            self.positive(limit, &format!("{path}.limit"))?,
            self.duration(window, &format!("{path}.window"))?,
        );
        if let Some(b) = burst {
            q = q.burst(self.positive(b, &format!("{path}.burst"))?);
        }
        if let Some(a) = algorithm {
            match Algorithm::from_name(a.get_ref()) {
                Some(alg) => q = q.algorithm(alg),
                None => {
                    return self.err(
                        a.span().start,
                        &format!("{path}.algorithm"),
                        format!(
                            "unknown algorithm '{}' (expected one of token_bucket, leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log)",
                            a.get_ref()
                        ),
                    );
                }
            }
        }
        // The remaining checks (rate too high, burst too large, limit too large for the cell).
        // A burst does nothing for a window algorithm (it admits `limit` a window): a key that
        // would be silently ignored is an error.
        if let Some(b) = burst {
            if !matches!(q.algo(), Algorithm::TokenBucket | Algorithm::LeakyBucket) {
                return self.err(
                    b.span().start,
                    &format!("{path}.burst"),
                    format!(
                        "only token_bucket and leaky_bucket have a burst; {} admits `limit` per window",
                        q.algo().name()
                    ),
                );
            }
        }
        // Each named at the field it is about: the burst's, the window's, or the limit's line.
        if let Err(e) = q.compile(0) {
            let (at, field) = match &e {
                Error::BurstTooLarge { .. } => {
                    burst.map_or((limit.span().start, "limit"), |b| (b.span().start, "burst"))
                }
                Error::PeriodTooLong { .. } => (window.span().start, "window"),
                Error::RateTooHigh { .. } => (window.span().start, "window"),
                _ => (limit.span().start, "limit"),
            };
            return self.err(at, &format!("{path}.{field}"), e);
        }
        Ok(q)
    }
}

/// Parses `"500ms"`, `"10s"`, `"5m"`, `"1h"`, `"1d"`, `"250us"`, `"10ns"`, sums of them
/// (`"1m30s"`, `"1h 30m"`) and fractions (`"1.5s"`, `"0.25h"`), in exact integer nanoseconds:
/// `None` for anything else, a fraction of a nanosecond, or a sum past `u64::MAX` ns.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == ' ')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let ns_per: u64 = match unit {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            _ => return None,
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || frac.contains('.') {
            return None;
        }
        let whole: u64 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut ns = whole.checked_mul(ns_per)?;
        if !frac.is_empty() {
            // The fraction's digits over 10^len, times the unit: whole nanoseconds only.
            let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
            let num = frac.parse::<u128>().ok()? * u128::from(ns_per);
            if num % scale != 0 {
                return None;
            }
            ns = ns.checked_add(u64::try_from(num / scale).ok()?)?;
        }
        total = total.checked_add(ns)?;
        rest = tail.trim_start();
    }
    Some(Duration::from_nanos(total))
}

impl PlanConfig {
    /// Parses a TOML document.
    pub fn parse(src: &str) -> Result<PlanConfig, Error> {
        let file: File = from_toml(src)?;
        Self::from_tables(src, file.plans)
    }

    /// Parses the `[plans.*]` tables of a document that also holds other top-level tables (the
    /// HTTP layer's `[http]`, which its own parser checks).
    #[cfg(feature = "http")]
    pub(crate) fn parse_plans_section(src: &str) -> Result<PlanConfig, Error> {
        #[derive(Deserialize)]
        struct Loose {
            plans: std::collections::BTreeMap<String, Spanned<RawPlan>>,
        }
        let file: Loose = from_toml(src)?;
        Self::from_tables(src, file.plans)
    }

    fn from_tables(
        src: &str,
        plans: std::collections::BTreeMap<String, Spanned<RawPlan>>,
    ) -> Result<PlanConfig, Error> {
        let ctx = Ctx { src };
        let mut tables: Vec<(String, Spanned<RawPlan>)> = plans.into_iter().collect();
        // File order: the first plan is the default one.
        tables.sort_by_key(|(_, p)| p.span().start);
        if tables.is_empty() {
            return Err(Error::Config {
                line: None,
                message: "plans: no plan defined".into(),
            });
        }
        let mut plans = Vec::new();
        for (name, raw) in tables {
            let at = raw.span().start;
            plans.push((name.clone(), ctx.plan(&name, at, raw.into_inner())?));
        }
        Ok(PlanConfig { plans })
    }

    /// Reads and parses a file.
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<PlanConfig, Error> {
        Self::parse(&read_source(path.as_ref())?)
    }

    /// The plan names, in file order.
    pub fn names(&self) -> Vec<&str> {
        self.plans.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The plan called `name`.
    pub fn get(&self, name: &str) -> Option<&Plan> {
        self.plans.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }

    pub(crate) fn into_plans(self) -> Vec<(String, Plan)> {
        self.plans
    }
}

impl Ctx<'_> {
    fn plan(&self, name: &str, at: usize, raw: RawPlan) -> Result<Plan, Error> {
        let path = format!("plans.{name}");
        let mut quotas = Vec::new();
        if raw.limit.is_some()
            || raw.window.is_some()
            || raw.burst.is_some()
            || raw.algorithm.is_some()
        {
            quotas.push(self.quota(
                at,
                &path,
                raw.limit.as_ref(),
                raw.window.as_ref(),
                raw.burst.as_ref(),
                raw.algorithm.as_ref(),
            )?);
        }
        if let Some(limits) = &raw.limits {
            for (i, l) in limits.get_ref().iter().enumerate() {
                let l_at = l.span().start;
                let l = l.get_ref();
                quotas.push(self.quota(
                    l_at,
                    &format!("{path}.limits[{i}]"),
                    l.limit.as_ref(),
                    l.window.as_ref(),
                    l.burst.as_ref(),
                    l.algorithm.as_ref(),
                )?);
            }
        }
        if quotas.is_empty() {
            return self.err(at, &path, "no limit: set `limit` and `window`, or `limits`");
        }
        if quotas.len() > MAX_PARTS {
            let at = raw.limits.as_ref().map_or(at, |l| l.span().start);
            return self.err(
                at,
                &format!("{path}.limits"),
                format!("at most {MAX_PARTS} limits per plan"),
            );
        }
        let mut plan = Plan::new(quotas).strategy(self.strategy(&path, &raw)?);
        if let Some(h) = &raw.headroom {
            let units = self.headroom(&path, h, &plan)?;
            plan = plan.headroom(units);
        }
        Ok(plan)
    }

    /// A plan's `strategy` (and `max_delay`, which only a queue has).
    fn strategy(&self, path: &str, raw: &RawPlan) -> Result<Strategy, Error> {
        if let (Some(d), false) = (
            &raw.max_delay,
            raw.strategy
                .as_ref()
                .is_some_and(|s| s.get_ref() == "queue"),
        ) {
            return self.err(
                d.span().start,
                &format!("{path}.max_delay"),
                "only with strategy = \"queue\" (it would do nothing)",
            );
        }
        Ok(match &raw.strategy {
            None => Strategy::Hard,
            Some(s) => match s.get_ref().as_str() {
                "hard" => Strategy::Hard,
                "soft" => Strategy::Soft,
                "shadow" => Strategy::Shadow,
                "queue" => {
                    let Some(d) = &raw.max_delay else {
                        return self.err(
                            s.span().start,
                            &format!("{path}.max_delay"),
                            "required with strategy = \"queue\"",
                        );
                    };
                    Strategy::Queue {
                        max_delay: self.duration(d, &format!("{path}.max_delay"))?,
                    }
                }
                other => {
                    return self.err(
                        s.span().start,
                        &format!("{path}.strategy"),
                        format!(
                            "unknown strategy '{other}' (expected hard, soft, shadow or queue)"
                        ),
                    );
                }
            },
        })
    }

    /// A plan's `headroom`: units below the smallest capacity of its quotas.
    fn headroom(&self, path: &str, h: &Spanned<i64>, plan: &Plan) -> Result<u64, Error> {
        let Ok(units) = u64::try_from(*h.get_ref()) else {
            return self.err(
                h.span().start,
                &format!("{path}.headroom"),
                "must not be negative",
            );
        };
        let capacity = plan.quotas().iter().map(Quota::capacity).min().unwrap_or(0);
        if units >= capacity {
            return self.err(
                h.span().start,
                &format!("{path}.headroom"),
                format!("{units} leaves nothing of capacity {capacity}"),
            );
        }
        Ok(units)
    }
}

/// A config file's text; a file that cannot be read is an [`Error::Config`] naming it.
pub(crate) fn read_source(path: &std::path::Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|e| Error::Config {
        line: None,
        message: format!("{}: {e}", path.display()),
    })
}

/// Deserializes a TOML document; every mistake is an [`Error::Config`] naming the line and the
/// exact dotted path of the field (`plans.pro.limits[1].burst`), however the document spells
/// it (dotted keys, inline tables, arrays over several lines).
pub(crate) fn from_toml<T: serde::de::DeserializeOwned>(src: &str) -> Result<T, Error> {
    let de = toml::Deserializer::parse(src).map_err(|e| toml_error(src, &e, None))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = field_path(e.path());
        toml_error(src, e.inner(), Some(path).filter(|p| !p.is_empty()))
    })
}

/// The dotted path of a field as a reader writes it: map keys joined by `.`, array items as
/// `[i]`, without the wrappers that carry spans.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if key.starts_with("$__") {
                    continue;
                }
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    out
}

fn toml_error(src: &str, e: &toml::de::Error, field: Option<String>) -> Error {
    let message = e.message().trim();
    let message = if message.contains("untagged enum RawDuration") {
        "expected a duration: whole seconds (60) or text (\"1m30s\", \"1.5s\", \"1h 30m\")"
            .to_string()
    } else {
        message
            .replace("expected i64", "expected an integer")
            .replace("expected a sequence", "expected a list")
    };
    let message = match field {
        Some(field) => format!("{field}: {message}"),
        None => message,
    };
    Error::Config {
        line: e.span().map(|span| line_of(src, span.start)),
        message,
    }
}
