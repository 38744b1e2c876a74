//! The rate-limit headers: `X-RateLimit-*` (GitHub style) and the IETF `RateLimit-Policy` /
//! `RateLimit` fields, made from decisions. The layer writes every response's headers with
//! [`RateLimitHeaders`]; another framework (actix-web, poem, a hand-written middleware) uses the
//! same formatter through [`headers`] or [`RateLimitHeaders`].

use std::fmt::Write as _;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::decision::{Decision, Reason};
use crate::http::config::HeaderStyle;
use crate::http::format;
use crate::quota::Quota;

/// One limit as the IETF headers name it (a plan, or a route rule, under a name), formatted
/// once: the `RateLimit-Policy` items of its parts (`"free";q=100;w=3600`, or `"pro.0"`,
/// `"pro.1"` for a compound plan).
///
/// ```
/// use tollgate::Quota;
/// use tollgate::http::HeaderPolicy;
/// let policy = HeaderPolicy::new("pro", &[Quota::per_second(10), Quota::per_day(10_000)]);
/// assert_eq!(policy.items(), r#""pro.0";q=10;w=1, "pro.1";q=10000;w=86400"#);
/// ```
#[derive(Debug, Clone)]
pub struct HeaderPolicy {
    /// The limit's name: the plan's, or the rule's.
    label: String,
    /// One structured-field string per part: `"free"`, or `"pro.0"`, `"pro.1"`.
    names: Vec<String>,
    /// What each part's decision reports as its `limit` (the burst for a bucket, the window's
    /// limit for a window): how a merged decision names its binding part.
    holds: Vec<u64>,
    /// The `RateLimit-Policy` items, joined: `"pro.0";q=4;w=1, "pro.1";q=100;w=3600`.
    items: String,
    /// `items` as a header value, for the common case of one limit.
    header: Option<HeaderValue>,
}

impl HeaderPolicy {
    /// The policy of a limit named `label` made of `quotas` (a plan's, in order).
    pub fn new(label: &str, quotas: &[Quota]) -> HeaderPolicy {
        let many = quotas.len() > 1;
        let mut names = Vec::with_capacity(quotas.len());
        let mut holds = Vec::with_capacity(quotas.len());
        let mut items = String::new();
        for (i, q) in quotas.iter().enumerate() {
            let name = if many {
                format::sf_string(&format!("{label}.{i}"))
            } else {
                format::sf_string(label)
            };
            if i > 0 {
                items.push_str(", ");
            }
            let _ = write!(
                items,
                "{name};q={};w={}",
                q.limit(),
                format::ceil_secs(crate::clock::nanos(q.period())).max(1)
            );
            let bucket = q.algo().name().ends_with("bucket");
            if q.burst_size() != q.limit() && bucket {
                let _ = write!(items, ";burst={}", q.burst_size());
            }
            holds.push(if bucket { q.burst_size() } else { q.limit() });
            names.push(name);
        }
        let header = HeaderValue::from_str(&items).ok();
        HeaderPolicy {
            label: label.to_string(),
            names,
            holds,
            items,
            header,
        }
    }

    /// The limit's name.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The `RateLimit-Policy` items of its parts.
    pub fn items(&self) -> &str {
        &self.items
    }
}

/// The headers of one response, from every limit that applied to it: add each limit's policy
/// and decision, then write them. `X-RateLimit-Limit` / `-Remaining` are the binding limit's
/// (the least remaining), `X-RateLimit-Reset` the Unix second (rounded up) when every limit is
/// full again; `RateLimit-Policy` lists every policy, `RateLimit` each part's remaining and
/// seconds until full; a soft limit's pass adds `Warning`, a denial `Retry-After`.
///
/// ```
/// use tollgate::http::{HeaderPolicy, HeaderStyle, RateLimitHeaders};
/// use tollgate::{FakeClock, Limiter, Quota};
/// let quota = Quota::per_minute(10);
/// let limiter = Limiter::<u64, _>::builder().quota(quota).clock(FakeClock::new()).build()?;
/// let (plan, route) = (HeaderPolicy::new("free", &[quota]), HeaderPolicy::new("/login", &[quota]));
/// let mut headers = RateLimitHeaders::new(HeaderStyle::Ietf);
/// headers.limit(&plan, &limiter.check(&1)).limit(&route, &limiter.check(&2));
/// let map = headers.to_header_map();
/// assert_eq!(map["ratelimit-policy"], r#""free";q=10;w=60, "/login";q=10;w=60"#);
/// assert_eq!(map["ratelimit"], r#""free";r=9;t=6, "/login";r=9;t=6"#);
/// # Ok::<(), tollgate::Error>(())
/// ```
#[derive(Debug)]
pub struct RateLimitHeaders<'a> {
    style: HeaderStyle,
    /// Now, in Unix nanoseconds (what `X-RateLimit-Reset` counts from).
    unix_now_ns: u64,
    /// Every limit's decision merged (the GitHub headers, and a denial's `Retry-After`).
    merged: Option<Decision>,
    /// The first limit's policy, and the items of every limit once there are several.
    first: Option<&'a HeaderPolicy>,
    joined: Option<String>,
    /// The `RateLimit` items.
    state: String,
    soft: bool,
}

impl<'a> RateLimitHeaders<'a> {
    /// Headers in `style`, reset times counted from the system clock.
    pub fn new(style: HeaderStyle) -> Self {
        let unix_now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, crate::clock::nanos);
        Self::at(style, unix_now_ns)
    }

    /// Headers in `style`, reset times counted from `unix_now_ns`.
    pub(crate) fn at(style: HeaderStyle, unix_now_ns: u64) -> Self {
        RateLimitHeaders {
            style,
            unix_now_ns,
            merged: None,
            first: None,
            joined: None,
            state: String::new(),
            soft: false,
        }
    }

    /// Adds a limit that applied: its policy and its decision. A compound plan's merged
    /// decision (what [`Limiter::check`](crate::Limiter::check) returns) describes its binding
    /// part, which is the one `RateLimit` lists.
    pub fn limit(&mut self, policy: &'a HeaderPolicy, decision: &Decision) -> &mut Self {
        if policy.names.len() <= 1 {
            return self.add(policy, decision, std::iter::once(decision));
        }
        let binding = policy
            .holds
            .iter()
            .position(|&h| h == decision.limit())
            .unwrap_or(0);
        self.add_named(policy, decision, [(binding, decision)].into_iter())
    }

    /// Adds a limit with each part's decision (`parts`, in the policy's order).
    pub(crate) fn add<'d>(
        &mut self,
        policy: &'a HeaderPolicy,
        decision: &Decision,
        parts: impl Iterator<Item = &'d Decision>,
    ) -> &mut Self {
        self.add_named(policy, decision, parts.enumerate())
    }

    fn add_named<'d>(
        &mut self,
        policy: &'a HeaderPolicy,
        decision: &Decision,
        parts: impl Iterator<Item = (usize, &'d Decision)>,
    ) -> &mut Self {
        self.soft |= decision.reason() == Reason::SoftLimit;
        match &mut self.merged {
            None => self.merged = Some(*decision),
            Some(m) => m.merge(decision),
        }
        if !self.style.ietf() {
            return self;
        }
        match (self.first, &mut self.joined) {
            (None, _) => self.first = Some(policy),
            (Some(first), joined) => {
                let items = joined.get_or_insert_with(|| first.items.clone());
                items.push_str(", ");
                items.push_str(&policy.items);
            }
        }
        self.state.reserve(32 * policy.names.len());
        for (i, d) in parts {
            let Some(name) = policy.names.get(i) else {
                continue;
            };
            if !self.state.is_empty() {
                self.state.push_str(", ");
            }
            let _ = write!(
                self.state,
                "{name};r={};t={}",
                d.remaining(),
                format::ceil_secs(d.reset_after_ns())
            );
        }
        self
    }

    /// The headers made of what was added.
    pub(crate) fn made(self) -> Made {
        let mut made = Made {
            soft: self.soft,
            ..Made::default()
        };
        let Some(merged) = self.merged else {
            return made;
        };
        if self.style.github() {
            made.github = Some([
                merged.limit(),
                merged.remaining(),
                format::unix_secs_at(self.unix_now_ns, 0, merged.reset_after_ns()),
            ]);
        }
        if self.style.ietf() {
            let policy = match (self.joined, self.first) {
                (Some(items), _) => HeaderValue::from_str(&items).ok(),
                (None, Some(one)) => one.header.clone(),
                (None, None) => None,
            };
            made.ietf = Some(Ietf {
                policy,
                state: HeaderValue::from_str(&self.state).ok(),
            });
        }
        made
    }

    /// Writes the headers into `headers` (a denial's `Retry-After` included).
    pub fn write(self, headers: &mut HeaderMap) {
        let denied = self.merged.filter(|d| !d.is_allowed());
        if let Some(d) = denied {
            insert_num(
                headers,
                http::header::RETRY_AFTER,
                format::retry_after_secs(d.retry_after_ns()),
            );
        }
        self.made().write(headers);
    }

    /// The headers as a map of their own.
    pub fn to_header_map(self) -> HeaderMap {
        let mut map = HeaderMap::new();
        self.write(&mut map);
        map
    }
}

/// The rate-limit headers the layer would write for one `decision` under `policy`, in
/// `style`: for a handler or another framework's middleware that checks a
/// [`Limiter`](crate::Limiter) itself. A denial gets `Retry-After` too.
///
/// ```
/// use tollgate::http::{HeaderPolicy, HeaderStyle, headers};
/// use tollgate::{FakeClock, Limiter, Quota};
/// let quota = Quota::per_hour(100);
/// let limiter = Limiter::<&str, _>::builder().quota(quota).clock(FakeClock::new()).build()?;
/// let policy = HeaderPolicy::new("free", &[quota]);
/// let map = headers(&limiter.check(&"alice"), &policy, HeaderStyle::Both);
/// assert_eq!(map["x-ratelimit-limit"], "100");
/// assert_eq!(map["x-ratelimit-remaining"], "99");
/// assert_eq!(map["ratelimit-policy"], r#""free";q=100;w=3600"#);
/// assert_eq!(map["ratelimit"], r#""free";r=99;t=36"#);
/// # Ok::<(), tollgate::Error>(())
/// ```
///
/// A hand-written axum middleware (the same shape serves actix-web or poem: check, then copy
/// the map into the response):
///
/// ```
/// use std::sync::Arc;
/// use axum::extract::Request;
/// use axum::http::StatusCode;
/// use axum::middleware::{Next, from_fn};
/// use axum::response::{IntoResponse, Response};
/// use axum::{Router, routing::get};
/// use tollgate::http::{HeaderPolicy, HeaderStyle, headers};
/// use tollgate::{Limiter, Quota};
///
/// let quota = Quota::per_minute(60);
/// let limiter = Arc::new(Limiter::<String>::builder().quota(quota).build()?);
/// let policy = Arc::new(HeaderPolicy::new("default", &[quota]));
/// let limit = move |req: Request, next: Next| {
///     let (limiter, policy) = (Arc::clone(&limiter), Arc::clone(&policy));
///     async move {
///         let tenant = req.headers().get("x-tenant").and_then(|v| v.to_str().ok());
///         let decision = limiter.check(&tenant.unwrap_or("anonymous").to_string());
///         let mut response: Response = if decision.is_allowed() {
///             next.run(req).await
///         } else {
///             (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response()
///         };
///         response.headers_mut().extend(headers(&decision, &policy, HeaderStyle::Both));
///         response
///     }
/// };
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(from_fn(limit));
/// # let _ = app;
/// # Ok::<(), tollgate::Error>(())
/// ```
pub fn headers(decision: &Decision, policy: &HeaderPolicy, style: HeaderStyle) -> HeaderMap {
    let mut made = RateLimitHeaders::new(style);
    made.limit(policy, decision);
    made.to_header_map()
}

/// The rate-limit headers of a response, made from its charges: `X-RateLimit-*` (limit,
/// remaining, reset as Unix seconds), the IETF `RateLimit-Policy` and `RateLimit`, and whether a
/// soft limit passed it (`Warning`). The layer makes these when a request is charged, so a
/// passed request without a refund hook carries these few values to its response instead of
/// its charges and the layer.
#[derive(Default)]
pub(crate) struct Made {
    github: Option<[u64; 3]>,
    ietf: Option<Ietf>,
    soft: bool,
}

/// The IETF headers: `RateLimit-Policy` and `RateLimit`.
struct Ietf {
    policy: Option<HeaderValue>,
    state: Option<HeaderValue>,
}

impl Made {
    /// True when there is nothing to add.
    pub(crate) fn is_empty(&self) -> bool {
        self.github.is_none() && self.ietf.is_none() && !self.soft
    }

    /// Adds the headers to `headers`.
    pub(crate) fn write(self, headers: &mut HeaderMap) {
        // One growth of the map at most, instead of one per header.
        let n = 3 * usize::from(self.github.is_some())
            + 2 * usize::from(self.ietf.is_some())
            + usize::from(self.soft);
        if n == 0 {
            return;
        }
        headers.reserve(n);
        if let Some([limit, remaining, reset]) = self.github {
            insert_num(headers, X_RATELIMIT_LIMIT, limit);
            insert_num(headers, X_RATELIMIT_REMAINING, remaining);
            insert_num(headers, X_RATELIMIT_RESET, reset);
        }
        if let Some(ietf) = self.ietf {
            if let Some(v) = ietf.policy {
                headers.insert(RATELIMIT_POLICY, v);
            }
            if let Some(v) = ietf.state {
                headers.insert(RATELIMIT, v);
            }
        }
        if self.soft {
            headers.insert(
                http::header::WARNING,
                HeaderValue::from_static(
                    "199 tollgate \"rate limit exceeded; passed by the soft limit\"",
                ),
            );
        }
    }
}

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

pub(crate) fn insert_num(headers: &mut HeaderMap, name: HeaderName, n: u64) {
    headers.insert(name, format::header_num(n));
}
