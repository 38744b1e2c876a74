//! The response side: the rate-limit headers (made at the charge, written when the inner
//! service answers), a refund after the response, the 429 and the layer's other answers, and
//! the response future that carries what a forwarded request's response needs.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

use super::charge::{Check, Checks, Passed, refund_all};
use super::{Denied, RateLimitLayer, plan_info};
use crate::clock::Clock;
use crate::decision::Reason;
use crate::http::keys::ClientKey;
use crate::http::{format, grpc};
use crate::quota::Quota;

/// The response body: axum's [`Body`](axum::body::Body), for every inner service. An inner
/// body that is axum's own passes through as it is (no allocation: axum, which boxes any other
/// body type a layer answers with, finds nothing to do); any other (hyper's, tonic's, a
/// `Full<Bytes>`) is boxed once, as axum and tonic would box it; the layer's own answers (429,
/// 400, gRPC statuses) are carried in it too.
pub type RateLimitBody = axum::body::Body;

/// The IETF policy items of one limit (a plan under a label), formatted once at construction.
#[derive(Debug)]
pub(super) struct Policy {
    /// The limit's name: the plan's, or the rule's.
    label: String,
    /// One structured-field string per part: `"free"`, or `"pro.0"`, `"pro.1"`.
    names: Vec<String>,
    /// The `RateLimit-Policy` items, joined: `"pro.0";q=4;w=1, "pro.1";q=100;w=3600`.
    items: String,
    /// `items` as a header value, for the common case of one limit.
    header: Option<HeaderValue>,
}

impl Policy {
    pub(super) fn new(label: &str, quotas: &[Quota]) -> Policy {
        let many = quotas.len() > 1;
        let mut names = Vec::with_capacity(quotas.len());
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
            if q.burst_size() != q.limit() && q.algo().name().ends_with("bucket") {
                let _ = write!(items, ";burst={}", q.burst_size());
            }
            names.push(name);
        }
        let header = HeaderValue::from_str(&items).ok();
        Policy {
            label: label.to_string(),
            names,
            items,
            header,
        }
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// What a passed request's response needs, riding along its future: nothing (no headers,
    /// no refund), the headers made now, or with a refund hook the charges and the layer (the
    /// refund decides the headers).
    #[inline(always)]
    pub(super) fn after(&self, checks: Checks, cost: u64) -> After<C> {
        if checks.is_empty() {
            After::Nothing
        } else if self.shared.hooks.refund.is_some() {
            After::Finish(Box::new((
                self.clone(),
                Passed {
                    checks,
                    cost,
                    delay: 0,
                },
            )))
        } else {
            let made = self.headers_for(&checks);
            if made.is_empty() {
                After::Nothing
            } else {
                After::Made(Box::new(made))
            }
        }
    }

    /// After the inner service answered a passed request: the refund, then the headers.
    pub(super) fn finish<B>(&self, resp: &mut Response<B>, passed: &mut Passed) {
        // Exact mode's charges are Redis's and cannot be taken back: no refund there.
        #[cfg(feature = "redis")]
        let refunds = !self.shared.core.exact;
        #[cfg(not(feature = "redis"))]
        let refunds = true;
        if refunds
            && self
                .shared
                .hooks
                .refund
                .as_ref()
                .is_some_and(|f| f(resp.status()))
        {
            refund_all(&self.shared.core.limiter, &mut passed.checks, passed.cost);
            self.shared.core.counters.refunded();
        }
        self.write_headers(resp.headers_mut(), &passed.checks);
    }

    /// The policy a check is described by: its plan's, or its rule's under that plan. `None`
    /// only if the plan vanished from the tables (never: the layer adds no plans).
    fn policy(&self, c: &Check) -> Option<&Policy> {
        let core = &self.shared.core;
        match c.key.rule {
            None => plan_info(&core.plans, c.plan).map(|p| &p.policy),
            Some(i) => core.rules[usize::from(i)].policies.get(&c.plan),
        }
    }

    /// Adds the configured headers for `checks` to `headers`.
    fn write_headers(&self, headers: &mut HeaderMap, checks: &[Check]) {
        self.headers_for(checks).write(headers);
    }

    /// Whether check `c` is a limit's in shadow mode (it adds no headers).
    fn shadowed(&self, c: &Check) -> bool {
        plan_info(&self.shared.core.plans, c.plan).is_some_and(|p| p.shadow)
    }

    /// The configured headers for `checks`, made now (see [`Made`]); limits in shadow mode
    /// add none.
    fn headers_for(&self, checks: &[Check]) -> Made {
        let checks = checks.iter().filter(|c| !self.shadowed(c));
        let style = self.shared.core.config.headers;
        let mut made = Made::default();
        let Some(first) = checks.clone().next() else {
            return made;
        };
        let single = checks.clone().nth(1).is_none();
        made.soft = checks
            .clone()
            .any(|c| c.detailed.decision.reason() == Reason::SoftLimit);
        if style.github() {
            let mut merged = first.detailed.decision;
            for c in checks.clone().skip(1) {
                merged.merge(&c.detailed.decision);
            }
            let epoch = self.shared.core.limiter.clock().unix_epoch_ns();
            made.github = Some([
                merged.limit(),
                merged.remaining(),
                format::unix_secs_at(epoch, first.detailed.now, merged.reset_after_ns()),
            ]);
        }
        if style.ietf() {
            let policy = match single {
                true => self.policy(first).and_then(|p| p.header.clone()),
                false => {
                    let mut items = String::new();
                    for p in checks.clone().filter_map(|c| self.policy(c)) {
                        if !items.is_empty() {
                            items.push_str(", ");
                        }
                        items.push_str(&p.items);
                    }
                    HeaderValue::from_str(&items).ok()
                }
            };
            let mut state = String::with_capacity(32 * checks.clone().count());
            for c in checks {
                let Some(policy) = self.policy(c) else {
                    continue;
                };
                for (name, d) in policy.names.iter().zip(c.detailed.parts()) {
                    if !state.is_empty() {
                        state.push_str(", ");
                    }
                    let _ = write!(
                        state,
                        "{name};r={};t={}",
                        d.remaining(),
                        format::ceil_secs(d.reset_after_ns())
                    );
                }
            }
            made.ietf = Some(Ietf {
                policy,
                state: HeaderValue::from_str(&state).ok(),
            });
        }
        made
    }

    /// The answer to a denial at `checks[at]`: the custom response, the gRPC status, or the
    /// JSON 429.
    pub(super) fn too_many(
        &self,
        parts: &http::request::Parts,
        client: &ClientKey,
        checks: &[Check],
        at: usize,
    ) -> Response<Full<Bytes>> {
        let c = &checks[at];
        let d = c.detailed.decision;
        let message = match d.reason() {
            Reason::Blocked => "You are temporarily blocked".to_string(),
            Reason::TableFull => "Too many clients are being tracked; try again later".to_string(),
            _ => {
                let quotas =
                    plan_info(&self.shared.core.plans, c.plan).map_or(&[][..], |p| &p.quotas[..]);
                // The part that denied (the first one not allowed).
                let q = quotas
                    .iter()
                    .zip(c.detailed.parts())
                    .find(|(_, d)| !d.is_allowed())
                    .or_else(|| quotas.iter().zip(c.detailed.parts()).next())
                    .map(|(q, _)| *q);
                match q {
                    Some(q) => format!(
                        "You have exceeded your {} requests per {} limit",
                        q.limit(),
                        format::period_words(crate::clock::nanos(q.period()))
                    ),
                    None => "Rate limit exceeded".to_string(),
                }
            }
        };
        let mut ours = HeaderMap::new();
        insert_num(
            &mut ours,
            http::header::RETRY_AFTER,
            format::retry_after_secs(d.retry_after_ns()),
        );
        self.write_headers(&mut ours, checks);
        if let Some(respond) = &self.shared.hooks.denied {
            let label = self.policy(c).map_or("", |p| p.label.as_str());
            let mut resp = respond(&Denied {
                request: parts,
                client,
                limit: label,
                decision: d,
                message: &message,
            });
            let h = resp.headers_mut();
            for (name, value) in &ours {
                if !h.contains_key(name) {
                    h.insert(name, value.clone());
                }
            }
            return resp;
        }
        let mut resp = if grpc::is_grpc(parts) {
            grpc::status(grpc::RESOURCE_EXHAUSTED, &message, Some(d.retry_after_ns()))
        } else {
            let epoch = self.shared.core.limiter.clock().unix_epoch_ns();
            let reset_at = format::rfc3339(format::unix_secs_at(
                epoch,
                c.detailed.now,
                d.retry_after_ns(),
            ));
            let body = serde_json::json!({
                "error": "Rate limit exceeded",
                "message": message,
                "reset_at": reset_at,
            })
            .to_string();
            let mut resp = Response::new(Full::new(Bytes::from(body)));
            *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        };
        resp.headers_mut().extend(ours);
        resp
    }
}

/// The rate-limit headers of a response, made from its charges: `X-RateLimit-*` (limit,
/// remaining, reset as Unix seconds), the IETF `RateLimit-Policy` and `RateLimit`, and whether a
/// soft limit passed it (`Warning`). Made when the request is charged, so a passed request
/// without a refund hook carries these few values to its response instead of its charges and
/// the layer.
#[derive(Default)]
pub(super) struct Made {
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
    fn is_empty(&self) -> bool {
        self.github.is_none() && self.ietf.is_none() && !self.soft
    }

    /// Adds the headers to `headers`.
    fn write(self, headers: &mut HeaderMap) {
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

fn insert_num(headers: &mut HeaderMap, name: HeaderName, n: u64) {
    headers.insert(name, format::header_num(n));
}

/// The layer's own answer that is not a denial: JSON with `status`, or for a gRPC request the
/// gRPC status `grpc_code`.
pub(super) fn reject(
    parts: &http::request::Parts,
    status: StatusCode,
    grpc_code: u32,
    error: &str,
    message: &str,
) -> Response<Full<Bytes>> {
    if grpc::is_grpc(parts) {
        return grpc::status(grpc_code, &format!("{error}: {message}"), None);
    }
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`]: the inner service's future with the headers added
    /// when it completes (no allocation of its own), the layer's own answer, or, with an async
    /// plan resolver or a queued request, a boxed future.
    pub struct ResponseFuture<F, E, C: Clock> {
        #[pin]
        state: State<F, E, C>,
    }
}

/// What a forwarded request adds to its response once the inner service answered.
pub(super) enum After<C: Clock> {
    /// Nothing (no headers, no refund hook; an exempt request).
    Nothing,
    /// The headers, made when the request was charged (boxed: the response future of every
    /// request, headers or not, stays one word larger than the inner one's, not five).
    Made(Box<Made>),
    /// With a refund hook: the charges and the layer, to refund and then make the headers.
    Finish(Box<(RateLimitLayer<C>, Passed)>),
}

type BoxedResponse<E> = Pin<Box<dyn Future<Output = Result<Response<RateLimitBody>, E>> + Send>>;

pin_project_lite::pin_project! {
    #[project = Projected]
    enum State<F, E, C: Clock> {
        // Forwarded; `after` finishes the response (none for an exempt request).
        Forward {
            #[pin]
            inner: F,
            after: After<C>,
        },
        // The layer answers itself (a 429, a 400, a gRPC status).
        Answer { response: Option<Response<Full<Bytes>>> },
        // An async resolver or a queue delay.
        Boxed { future: BoxedResponse<E> },
    }
}

impl<F, E, C: Clock> ResponseFuture<F, E, C> {
    #[inline(always)]
    pub(super) fn answer(response: Response<Full<Bytes>>) -> Self {
        ResponseFuture {
            state: State::Answer {
                response: Some(response),
            },
        }
    }
    #[inline(always)]
    pub(super) fn forward(inner: F, after: After<C>) -> Self {
        ResponseFuture {
            state: State::Forward { inner, after },
        }
    }
    pub(super) fn boxed(
        future: impl Future<Output = Result<Response<RateLimitBody>, E>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            state: State::Boxed {
                future: Box::pin(future),
            },
        }
    }
}

impl<F, B, E, C> Future for ResponseFuture<F, E, C>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: Clock,
{
    type Output = Result<Response<RateLimitBody>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            Projected::Forward { inner, after } => {
                let mut resp = std::task::ready!(inner.poll(cx))?;
                if !matches!(after, After::Nothing) {
                    match std::mem::replace(after, After::Nothing) {
                        After::Nothing => {}
                        After::Made(made) => made.write(resp.headers_mut()),
                        After::Finish(f) => {
                            let (layer, mut passed) = *f;
                            layer.finish(&mut resp, &mut passed);
                        }
                    }
                }
                Poll::Ready(Ok(resp.map(RateLimitBody::new)))
            }
            Projected::Answer { response } => Poll::Ready(Ok(response
                .take()
                .expect("a ResponseFuture polled after it completed")
                .map(RateLimitBody::new))),
            Projected::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, E, C: Clock> std::fmt::Debug for ResponseFuture<F, E, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.state {
            State::Forward { .. } => "ResponseFuture::Forward",
            State::Answer { .. } => "ResponseFuture::Answer",
            State::Boxed { .. } => "ResponseFuture::Boxed",
        })
    }
}
