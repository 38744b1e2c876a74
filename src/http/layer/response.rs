//! The response side: the rate-limit headers (made at the charge, written when the inner
//! service answers), a refund after the response, the 429 and the layer's other answers, and
//! the response future that carries what a forwarded request's response needs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::HeaderValue;
use http::{HeaderMap, Response, StatusCode};

use super::charge::{Check, Checks, Passed, refund_all};
use super::{Answer, Denied, Limit, RateLimitLayer, plan_info};
use crate::clock::Clock;
use crate::decision::Reason;
use crate::http::headers::{Made, RateLimitHeaders, insert_num};
use crate::http::keys::ClientKey;
use crate::http::metrics::LimitLabels;
use crate::http::{format, grpc};

/// The response body: axum's [`Body`](axum::body::Body), for every inner service. An inner
/// body that is axum's own passes through as it is (no allocation: axum, which boxes any other
/// body type a layer answers with, finds nothing to do); any other (hyper's, tonic's, a
/// `Full<Bytes>`) is boxed once, as axum and tonic would box it; the layer's own answers (429,
/// 400, gRPC statuses) are carried in it too.
pub type RateLimitBody = axum::body::Body;

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
    fn policy(&self, c: &Check) -> Option<&Limit> {
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
        let style = self.shared.core.config.headers;
        let mut shown = checks.iter().filter(|c| !self.shadowed(c)).peekable();
        let Some(first) = shown.peek() else {
            return Made::default();
        };
        let epoch = self.shared.core.limiter.clock().unix_epoch_ns();
        let mut made = RateLimitHeaders::at(style, epoch.saturating_add(first.detailed.now));
        for c in shown {
            if let Some(limit) = self.policy(c) {
                made.add(&limit.policy, &c.detailed.decision, c.detailed.parts());
            }
        }
        made.made()
    }

    /// The `tollgate_http_limited_total` counter of the limit that denied `c`: its part that
    /// denied, or why the key was denied before any part decided (a penalty, a full table).
    pub(super) fn denied_by(&self, c: &Check) -> usize {
        match c.detailed.decision.reason() {
            Reason::Blocked => LimitLabels::BLOCKED,
            Reason::TableFull => LimitLabels::TABLE_FULL,
            _ => {
                let part = c
                    .detailed
                    .parts()
                    .position(|d| !d.is_allowed())
                    .unwrap_or(0);
                let counters = self.policy(c).map_or(&[][..], |l| &l.counters[..]);
                counters
                    .get(part)
                    .or(counters.first())
                    .copied()
                    .unwrap_or(LimitLabels::BLOCKED)
            }
        }
    }

    /// The answer to a denial at `checks[at]`: the custom response, the gRPC status, or the
    /// JSON 429.
    pub(super) fn too_many(
        &self,
        parts: &http::request::Parts,
        client: &ClientKey,
        checks: &[Check],
        at: usize,
    ) -> Answer {
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
            let label = self.policy(c).map_or("", |p| p.policy.label());
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
                .map(RateLimitBody::new)
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
            let mut resp = Response::new(RateLimitBody::from(body));
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

/// The layer's own answer that is not a denial: JSON with `status`, or for a gRPC request the
/// gRPC status `grpc_code`.
pub(super) fn reject(
    parts: &http::request::Parts,
    status: StatusCode,
    grpc_code: u32,
    error: &str,
    message: &str,
) -> Answer {
    if grpc::is_grpc(parts) {
        return grpc::status(grpc_code, &format!("{error}: {message}"), None)
            .map(RateLimitBody::new);
    }
    let body = serde_json::json!({ "error": error, "message": message }).to_string();
    let mut resp = Response::new(RateLimitBody::from(body));
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
        Answer { response: Option<Answer> },
        // An async resolver or a queue delay.
        Boxed { future: BoxedResponse<E> },
    }
}

impl<F, E, C: Clock> ResponseFuture<F, E, C> {
    #[inline(always)]
    pub(super) fn answer(response: Answer) -> Self {
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
                .expect("a ResponseFuture polled after it completed"))),
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
