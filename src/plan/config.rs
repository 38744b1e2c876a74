//! Plans from a TOML file: tiers such as free / pro / enterprise (every key: `docs/config.md`).
//!
//! ```toml
//! [plans.free]
//! limit = 100
//! window = 86400          # seconds, or a string: "500ms", "10s", "5m", "1h", "1d", "1m30s", "1.5s"
//! burst = 10
//! algorithm = "token_bucket"   # leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log
//!
//! [plans.pro]              # a compound plan: every limit must pass
//! strategy = "soft"        # hard (default), soft, shadow, queue (with max_delay); priority via headroom
//! limits = [ { limit = 10, window = "1s" }, { limit = 10000, window = "1d", burst = 100 } ]
//! ```
//!
//! Every mistake is an [`Error::Config`] that names the field and its line.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

#[cfg(any(test, feature = "http"))]
pub(crate) use super::duration::parse_duration;
use super::duration::{DurationError, EXPECTED_DURATION, Int, RawDuration};
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
///
/// In an app's own config (figment, config-rs, serde_json, toml...), it is a field like any
/// other (`Deserialize`), with the same tables, checks and messages as the file; every key is
/// in `docs/config.md`.
///
/// ```
/// use serde::Deserialize;
/// use tollgate::{Limiter, PlanConfig};
///
/// #[derive(Deserialize)]
/// struct AppConfig {
///     listen: String,
///     rate_limits: PlanConfig,
/// }
///
/// let app: AppConfig = toml::from_str(r#"
/// listen = "0.0.0.0:8080"
///
/// [rate_limits.plans.free]
/// limit = 100
/// window = "1m"
///
/// [rate_limits.plans.pro]
/// limits = [ { limit = 10, window = "1s" }, { limit = 10000, window = "1d" } ]
/// "#)?;
/// assert_eq!(app.listen, "0.0.0.0:8080");
/// assert_eq!(app.rate_limits.names(), ["free", "pro"]);
/// let limiter = Limiter::<u64>::builder().plans(app.rate_limits).build()?;
/// assert_eq!(limiter.check(&1).limit(), 100); // the first plan is the default one
///
/// // The same checks as the file, naming the field (the app's parser adds where it is).
/// let err = toml::from_str::<AppConfig>(
///     "listen = \"x\"\n[rate_limits.plans.free]\nlimit = 0\nwindow = 60\n",
/// )
/// .err()
/// .unwrap();
/// assert!(err.to_string().contains("plans.free.limit: must be at least 1, got 0"), "{err}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Plans keep the order the format gives them, and the first is the default plan (the one
/// [`Limiter::check`](crate::Limiter::check) uses): a source that sorts its keys (figment, a
/// `serde_json::Value`) or does not keep their order makes the alphabetically first, or any,
/// plan the default. Give the builder a [`quota`](crate::Builder::quota) of its own, or, in
/// the HTTP layer's `HttpConfig`, set `http.default_plan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    plans: Vec<(String, Plan)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    plans: std::collections::BTreeMap<String, Spanned<RawPlan>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    limit: Option<Spanned<Int>>,
    window: Option<Spanned<RawDuration>>,
    burst: Option<Spanned<Int>>,
    algorithm: Option<Spanned<String>>,
    strategy: Option<Spanned<String>>,
    max_delay: Option<Spanned<RawDuration>>,
    headroom: Option<Spanned<Int>>,
    limits: Option<Spanned<Vec<Spanned<RawLimit>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    limit: Option<Spanned<Int>>,
    window: Option<Spanned<RawDuration>>,
    burst: Option<Spanned<Int>>,
    algorithm: Option<Spanned<String>>,
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

    fn positive(&self, v: &Spanned<Int>, field: &str) -> Result<u64, Error> {
        if v.get_ref().0 < 1 {
            return self.err(
                v.span().start,
                field,
                format!("must be at least 1, got {}", v.get_ref()),
            );
        }
        Ok(v.get_ref().saturated())
    }

    /// A positive duration of at most `max`; one too long is named in the unit written.
    fn duration(
        &self,
        v: &Spanned<RawDuration>,
        field: &str,
        max: Duration,
    ) -> Result<Duration, Error> {
        let what = field.rsplit('.').next().unwrap_or(field);
        match v.get_ref().to_duration(max) {
            Ok(d) => Ok(d),
            Err(DurationError::TooLong { written, max }) => self.err(
                v.span().start,
                field,
                format!("{written} is longer than the longest {what}, {max}"),
            ),
            Err(DurationError::NotPositive) => self.err(
                v.span().start,
                field,
                "must be a positive duration: whole seconds, or a string like \"500ms\", \"10s\", \"5m\", \"1h\", \"1d\", \"1m30s\", \"1.5s\"",
            ),
        }
    }

    fn quota(&self, at: usize, path: &str, keys: QuotaKeys<'_>) -> Result<Quota, Error> {
        let Some(limit) = keys.limit else {
            return self.err(at, path, "missing field `limit`");
        };
        let Some(window) = keys.window else {
            return self.err(at, path, "missing field `window`");
        };
        let mut q = Quota::new(
            self.positive(limit, &format!("{path}.limit"))?,
            self.duration(window, &format!("{path}.window"), Quota::MAX_PERIOD)?,
        );
        if let Some(b) = keys.burst {
            q = q.burst(self.positive(b, &format!("{path}.burst"))?);
        }
        if let Some(a) = keys.algorithm {
            q = q.algorithm(self.algorithm(a, &format!("{path}.algorithm"))?);
        }
        // A burst does nothing for a window algorithm (it admits `limit` a window): a key that
        // would be silently ignored is an error.
        if let Some(b) = keys.burst {
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
        // The remaining checks (rate too high, burst too large, limit too large for the cell),
        // each named at the field it is about with the value as written and the largest accepted.
        if let Err(e) = q.compile(0) {
            let per = window_written(window.get_ref());
            let (at, field, message) = match e {
                Error::BurstTooLarge { max, .. } => {
                    let (at, field, value) = keys
                        .burst
                        .map_or((limit.span().start, "limit", limit.get_ref()), |b| {
                            (b.span().start, "burst", b.get_ref())
                        });
                    let message = format!("{value} is too large for this rate (at most {max})");
                    (at, field, message)
                }
                Error::RateTooHigh { period_ns, .. } => (
                    limit.span().start,
                    "limit",
                    format!(
                        "{} per {per} is more than one per nanosecond (at most {period_ns} per {per})",
                        limit.get_ref()
                    ),
                ),
                Error::LimitTooLarge { algorithm, max, .. } => (
                    limit.span().start,
                    "limit",
                    format!(
                        "{} is too large for {algorithm} (at most {max})",
                        limit.get_ref()
                    ),
                ),
                e => (limit.span().start, "limit", e.to_string()),
            };
            return self.err(at, &format!("{path}.{field}"), message);
        }
        Ok(q)
    }

    /// An algorithm by its name. `gcra` is refused with a hint: here GCRA is the automaton of
    /// both `token_bucket` and `leaky_bucket`, so the name would not say which one is meant.
    fn algorithm(&self, a: &Spanned<String>, field: &str) -> Result<Algorithm, Error> {
        if let Some(alg) = Algorithm::from_name(a.get_ref()) {
            return Ok(alg);
        }
        let message = if a.get_ref().eq_ignore_ascii_case("gcra") {
            format!(
                "unknown algorithm '{}': GCRA runs both token_bucket and leaky_bucket here, so write the one you mean",
                a.get_ref()
            )
        } else {
            format!(
                "unknown algorithm '{}' (expected one of token_bucket, leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log)",
                a.get_ref()
            )
        };
        self.err(a.span().start, field, message)
    }
}

/// The keys of one quota: a plan's own `limit`, `window`, `burst`, `algorithm`, or one item of
/// its `limits`.
struct QuotaKeys<'a> {
    limit: Option<&'a Spanned<Int>>,
    window: Option<&'a Spanned<RawDuration>>,
    burst: Option<&'a Spanned<Int>>,
    algorithm: Option<&'a Spanned<String>>,
}

impl<'a> QuotaKeys<'a> {
    fn of_plan(raw: &'a RawPlan) -> Self {
        QuotaKeys {
            limit: raw.limit.as_ref(),
            window: raw.window.as_ref(),
            burst: raw.burst.as_ref(),
            algorithm: raw.algorithm.as_ref(),
        }
    }
    fn of_limit(raw: &'a RawLimit) -> Self {
        QuotaKeys {
            limit: raw.limit.as_ref(),
            window: raw.window.as_ref(),
            burst: raw.burst.as_ref(),
            algorithm: raw.algorithm.as_ref(),
        }
    }
    /// The first key set, in the order a reader looks for them.
    fn first_set(&self) -> Option<(&'static str, usize)> {
        [
            ("limit", self.limit.map(|v| v.span().start)),
            ("window", self.window.map(|v| v.span().start)),
            ("burst", self.burst.map(|v| v.span().start)),
            ("algorithm", self.algorithm.map(|v| v.span().start)),
        ]
        .into_iter()
        .find_map(|(name, at)| Some((name, at?)))
    }
}

/// A window as the user wrote it: `"1m30s"`, or whole seconds as `"60s"`.
fn window_written(window: &RawDuration) -> String {
    match window {
        RawDuration::Seconds(s) => format!("{s}s"),
        RawDuration::Text(t) => t.trim().to_string(),
    }
}

/// A `PlanConfig` inside an app's own config, from any serde format: the same table as the
/// file (`plans.NAME...`), the same checks and messages (each naming the dotted field, with no
/// line: the line belongs to the app's parser).
impl<'de> Deserialize<'de> for PlanConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_via(d, PlanConfig::parse)
    }
}

/// The file a `PlanConfig` was read from, as a table (`plans.NAME...`): `toml::to_string`
/// writes a file that parses back to an equal config, and any serde format writes the same
/// keys. Durations are written in the largest unit that divides them (`"1d"`, `"1500ms"`);
/// defaults are left out.
///
/// ```
/// use tollgate::PlanConfig;
/// let config = PlanConfig::parse(
///     "[plans.pro]\nstrategy = \"soft\"\nlimits = [ { limit = 10, window = \"1s\" }, { limit = 10000, window = 86400, burst = 100 } ]\n",
/// )?;
/// let text = toml::to_string(&config)?;
/// assert_eq!(PlanConfig::parse(&text)?, config);
/// assert!(text.contains("window = \"1d\""), "{text}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl serde::Serialize for PlanConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Plans<'a>(&'a [(String, Plan)]);
        impl serde::Serialize for Plans<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(name, plan)| (name, PlanOut(plan))))
            }
        }
        let mut top = s.serialize_map(Some(1))?;
        top.serialize_entry("plans", &Plans(&self.plans))?;
        top.end()
    }
}

/// One plan as its table writes it: its own quota's keys, or `limits`.
struct PlanOut<'a>(&'a Plan);

impl serde::Serialize for PlanOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let plan = self.0;
        let mut map = s.serialize_map(None)?;
        match plan.strategy_kind() {
            Strategy::Hard => {}
            Strategy::Soft => map.serialize_entry("strategy", "soft")?,
            Strategy::Shadow => map.serialize_entry("strategy", "shadow")?,
            Strategy::Queue { max_delay } => {
                map.serialize_entry("strategy", "queue")?;
                map.serialize_entry("max_delay", &super::duration::written(max_delay))?;
            }
        }
        if plan.headroom_units() > 0 {
            map.serialize_entry("headroom", &plan.headroom_units())?;
        }
        match plan.quotas() {
            [one] => QuotaOut(one).entries(&mut map)?,
            many => {
                let limits: Vec<QuotaOut<'_>> = many.iter().map(QuotaOut).collect();
                map.serialize_entry("limits", &limits)?;
            }
        }
        map.end()
    }
}

/// One quota's keys: `limit`, `window`, and `burst` and `algorithm` where not the default (a
/// burst only for the buckets, the only algorithms that have one).
struct QuotaOut<'a>(&'a Quota);

impl QuotaOut<'_> {
    fn entries<M: serde::ser::SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        let q = self.0;
        map.serialize_entry("limit", &q.limit())?;
        map.serialize_entry("window", &super::duration::written(q.period()))?;
        let bucket = matches!(q.algo(), Algorithm::TokenBucket | Algorithm::LeakyBucket);
        if let (Some(burst), true) = (q.burst_set(), bucket) {
            map.serialize_entry("burst", &burst)?;
        }
        if q.algo() != Algorithm::TokenBucket {
            map.serialize_entry("algorithm", q.algo().name())?;
        }
        Ok(())
    }
}

impl serde::Serialize for QuotaOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        self.entries(&mut map)?;
        map.end()
    }
}

/// Deserializes a config the way its file parser reads it, from any self-describing format: the
/// value is taken as a TOML table (in the order the format gives its keys), written out as TOML
/// and read by `parse`, so an embedded config gets exactly the checks of a file. An error keeps
/// its message (the dotted field) and drops its line, which would count lines of that text.
pub(crate) fn deserialize_via<'de, D, T>(
    d: D,
    parse: fn(&str) -> Result<T, Error>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    let table = toml::Table::deserialize(d)?;
    let text = toml::to_string(&table).map_err(D::Error::custom)?;
    parse(&text).map_err(|e| match e {
        Error::Config { message, .. } => D::Error::custom(message),
        e => D::Error::custom(e),
    })
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
        let own = QuotaKeys::of_plan(&raw);
        let mut quotas = Vec::new();
        match (own.first_set(), &raw.limits) {
            // Both would be parts of one compound plan: a reader of either would miss the other.
            (Some((key, key_at)), Some(_)) => {
                return self.err(
                    key_at,
                    &path,
                    format!("`{key}` beside `limits`: a plan has either its own `limit` and `window`, or a list of `limits`; write every limit in `limits`"),
                );
            }
            (Some(_), None) => quotas.push(self.quota(at, &path, own)?),
            (None, Some(limits)) => {
                for (i, l) in limits.get_ref().iter().enumerate() {
                    let keys = QuotaKeys::of_limit(l.get_ref());
                    quotas.push(self.quota(
                        l.span().start,
                        &format!("{path}.limits[{i}]"),
                        keys,
                    )?);
                }
            }
            (None, None) => {}
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
                        max_delay: self.duration(
                            d,
                            &format!("{path}.max_delay"),
                            Duration::from_nanos(u64::MAX),
                        )?,
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
    fn headroom(&self, path: &str, h: &Spanned<Int>, plan: &Plan) -> Result<u64, Error> {
        let written = h.get_ref().0;
        if written < 0 {
            return self.err(
                h.span().start,
                &format!("{path}.headroom"),
                format!("must not be negative, got {written}"),
            );
        }
        let capacity = plan.quotas().iter().map(Quota::capacity).min().unwrap_or(0);
        if written >= i128::from(capacity) {
            return self.err(
                h.span().start,
                &format!("{path}.headroom"),
                format!(
                    "{written} leaves nothing of capacity {capacity} (at most {})",
                    capacity.saturating_sub(1)
                ),
            );
        }
        Ok(h.get_ref().saturated())
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
    let message = if message.contains(EXPECTED_DURATION) {
        format!("expected {EXPECTED_DURATION}")
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
