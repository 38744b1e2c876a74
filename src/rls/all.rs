//! The extra `check_all: true` of a domain: a request's limited descriptors are admitted all
//! together or not at all, through the engine's [`check_all`](crate::check_all) (every part
//! charged, or the charged ones refunded). Each limit is then the engine's own (a window of
//! `requests_per_unit`, or its `algorithm`), so a denied request charges nothing anywhere.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;

use super::matching::Matched;
use super::service::{Active, RlsService, status_of};
use super::stats::Charge;
use crate::{Bound, MonotonicClock, Part, PlanId, check_all};

impl RlsService {
    /// Charges every matched descriptor of a request at once, `hits` each: its status and
    /// whether it is over, per descriptor (`None` where nothing matched).
    pub(crate) fn charge_all(
        &self,
        active: &Active,
        matched: &[Option<Matched>],
        hits: u64,
    ) -> Vec<Option<(DescriptorStatus, bool)>> {
        let plan_of = |m: &Matched| m.plan.unwrap_or_else(|| active.plans[&m.limit.full_key]);
        let bound: Vec<Bound<'_, String, MonotonicClock>> = matched
            .iter()
            .flatten()
            .map(|m| self.limiter.key_in(&m.key, plan_of(m)))
            .collect();
        let parts: Vec<&dyn Part> = bound.iter().map(|b| b as &dyn Part).collect();
        let allowed = parts.is_empty() || check_all(&parts, hits).is_ok_and(|d| d.is_allowed());
        let unix_s = self.unix_s();
        matched
            .iter()
            .map(|m| {
                let m = m.as_ref()?;
                let l = u64::from(m.limit.requests_per_unit);
                let left = self.left_now(&m.key, plan_of(m));
                // Admitted: every part was charged `hits`. Denied: nothing was, and the parts
                // that cannot take `hits` now are the over ones.
                let over = !allowed && left < hits;
                let before = if allowed {
                    l.saturating_sub(left + hits)
                } else {
                    l.saturating_sub(left)
                };
                if allowed || over {
                    self.count_stats(m, Charge { before, hits, over });
                } else {
                    // Neither admitted nor over: another descriptor denied the request.
                    self.count_unadmitted(m, hits);
                }
                let remaining = if over {
                    0
                } else {
                    left.min(u64::from(u32::MAX))
                };
                Some((
                    status_of(&m.limit, over, remaining as u32, unix_s),
                    !allowed,
                ))
            })
            .collect()
    }

    /// Units a key may spend now under `plan` (nothing charged).
    fn left_now(&self, key: &String, plan: PlanId) -> u64 {
        match self.limiter.peek_in(key, plan, 1) {
            Ok(d) if d.is_allowed() => d.remaining() + 1,
            Ok(d) => d.remaining(),
            Err(_) => 0,
        }
    }
}
