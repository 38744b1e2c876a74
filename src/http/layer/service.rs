//! The tower service and its request paths. `call` decides the common request (a layer keyed
//! by address alone, in process, nothing else reading the head: `plain_key`) from its head as
//! it is; every other request is split into its parts and goes through the front, then its
//! plan (a resolver's future, boxed; or the API key table), then its charge (exact mode's Redis
//! call, boxed; or in process).

use bytes::Bytes;
use std::task::{Context, Poll};

use http::{HeaderMap, Request, Response};

use super::charge::{Check, Checks, Passed};
use super::front::{Front, peer_ip};
use super::response::{After, ResponseFuture};
use super::{HttpKey, RateLimitBody, RateLimitLayer};
use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock};
use crate::http::keys::{ClientKey, api_key_from_headers, client_ip_from_headers};
use crate::ip::client_ip_key;
use crate::plan::PlanId;

impl<S, C: Clock> tower::Layer<S> for RateLimitLayer<C> {
    type Service = RateLimit<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RateLimitLayer`] wraps around an inner service.
pub struct RateLimit<S, C: Clock = MonotonicClock> {
    inner: S,
    layer: RateLimitLayer<C>,
}

impl<S: Clone, C: Clock> Clone for RateLimit<S, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<C: Clock> RateLimitLayer<C> {
    /// The key and plan of a request that the plain path decides, read from its head as it is
    /// (no `Parts` to split off and put back): when the layer keys by address alone and
    /// nothing else reads the head (no hooks but a refund, no exemptions, no rules, in
    /// process) and the address is there. `None`: the general path decides (it does the same
    /// for these requests, and answers the rest).
    #[inline(always)]
    fn plain_key(
        &self,
        headers: &HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<(HttpKey, PlanId)> {
        let shared = &*self.shared;
        if !shared.plain {
            return None;
        }
        let core = &shared.core;
        let c = &core.config;
        let peer = peer_ip(extensions)?;
        let ip = if c.trusted.is_empty() {
            // No proxy to walk back through (`client_ip_from_headers` without the calls).
            client_ip_key(peer, c.v6_prefix)
        } else {
            client_ip_from_headers(peer, headers, c.forwarded, &c.trusted, c.v6_prefix).ok()?
        };
        // `plan_from_table` for an address key: the API key header's plan, else the default.
        let plan = if core.api_key_plans.is_empty() {
            core.default_plan
        } else {
            api_key_from_headers(headers, core.api_key_header.as_str())
                .ok()
                .and_then(|k| core.api_key_plans.get(k).copied())
                .unwrap_or(core.default_plan)
        };
        let key = HttpKey {
            rule: None,
            client: ClientKey::Ip(ip),
        };
        Some((key, plan))
    }
}

impl<S, C, ReqBody, ResBody> tower::Service<Request<ReqBody>> for RateLimit<S, C>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<RateLimitBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S::Error, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The inner service is called here, while it is ready, on every path but the boxed
        // ones; those take the ready service along and leave a clone for the next
        // `poll_ready` (the usual tower pattern).
        // The layer as the newest reload left it, kept: this service looks it up once per
        // reload (a clone of a stale service, as axum makes per request, once per request).
        if let Some(newer) = self.layer.refreshed() {
            self.layer = newer;
        }
        let (inner, layer) = (&mut self.inner, &self.layer);
        if let Some((key, plan)) = layer.plain_key(req.headers(), req.extensions()) {
            // The common request (see `plain_key`): decided from its head as it is.
            layer.shared.core.counters.request();
            let carry = |check: Check| layer.after(Checks::One(check), 1);
            let charged = layer
                .shared
                .core
                .limiter
                .charge_detailed(&key, plan, 1, Mode::Check);
            let after = match layer.settle_one(key, plan, charged, After::Nothing, carry) {
                Ok(after) => after,
                Err(verdict) => {
                    // Not a plain pass: the answer reads the head's parts.
                    let (parts, body) = req.into_parts();
                    match layer.answer(&parts, verdict, 1) {
                        Ok(passed) => {
                            return forward_passed(
                                layer,
                                inner,
                                Request::from_parts(parts, body),
                                passed,
                            );
                        }
                        Err(resp) => return ResponseFuture::answer(resp),
                    }
                }
            };
            return ResponseFuture::forward(inner.call(req), after);
        }
        let (parts, body) = req.into_parts();
        let (client, cost) = match layer.front(&parts) {
            Err(resp) => return ResponseFuture::answer(resp),
            Ok(Front::Exempt) => {
                return ResponseFuture::forward(
                    inner.call(Request::from_parts(parts, body)),
                    After::Nothing,
                );
            }
            Ok(Front::Charge { client, cost }) => (client, cost),
        };
        if let Some(resolve) = &layer.shared.hooks.resolver {
            // An async plan lookup: the rest runs in a boxed future of its own.
            let resolving = resolve(&parts, &client);
            let layer = layer.clone();
            let inner = taken(inner);
            return ResponseFuture::boxed(async move {
                let name = resolving.await;
                let found = layer.plan_named(&parts, client, name);
                let passed = match layer.charge_any(&parts, found, cost).await {
                    Ok(p) => p,
                    Err(resp) => return Ok(resp),
                };
                forward_after(layer, inner, Request::from_parts(parts, body), passed).await
            });
        }
        let found = layer.plan_from_table(&parts, client);
        #[cfg(feature = "redis")]
        if layer.shared.core.exact {
            // Exact mode: the charge is a Redis call, awaited in a boxed future of its own.
            let layer = layer.clone();
            let inner = taken(inner);
            return ResponseFuture::boxed(async move {
                let passed = match layer.charge_exact(&parts, found, cost).await {
                    Ok(p) => p,
                    Err(resp) => return Ok(resp),
                };
                forward_after(layer, inner, Request::from_parts(parts, body), passed).await
            });
        }
        match layer.charge(&parts, found, cost) {
            Ok(passed) => forward_passed(layer, inner, Request::from_parts(parts, body), passed),
            Err(resp) => ResponseFuture::answer(resp),
        }
    }
}

/// The ready inner service, taken for a boxed future; a clone stays for the next `poll_ready`.
fn taken<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// Forwards a request that passed: held first for a queue's delay (in a boxed future), with
/// what its response needs riding along ([`RateLimitLayer::after`]).
#[inline(always)]
fn forward_passed<S, C, ReqBody, ResBody>(
    layer: &RateLimitLayer<C>,
    inner: &mut S,
    req: Request<ReqBody>,
    passed: Passed,
) -> ResponseFuture<S::Future, S::Error, C>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if passed.delay > 0 {
        // The queue strategy: held until the reservation's moment.
        let layer = layer.clone();
        return ResponseFuture::boxed(forward_after(layer, taken(inner), req, passed));
    }
    let after = layer.after(passed.checks, passed.cost);
    ResponseFuture::forward(inner.call(req), after)
}

/// Holds a passed request for its delay, forwards it, then finishes the response.
async fn forward_after<S, C, ReqBody, ResBody>(
    layer: RateLimitLayer<C>,
    mut inner: S,
    req: Request<ReqBody>,
    mut passed: Passed,
) -> Result<Response<RateLimitBody>, S::Error>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: Clock,
{
    if passed.delay > 0 {
        tokio::time::sleep(std::time::Duration::from_nanos(passed.delay)).await;
    }
    let mut resp = inner.call(req).await?;
    layer.finish(&mut resp, &mut passed);
    Ok(resp.map(RateLimitBody::new))
}

impl<S: std::fmt::Debug, C: Clock + std::fmt::Debug> std::fmt::Debug for RateLimit<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}
