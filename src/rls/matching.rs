//! Which configured limit a request descriptor falls under, walked as upstream walks it.
//!
//! At each level the entry `key_value` is looked up first, then the level's wildcard entries
//! (`value: foo*`, in config order), then the key alone (an entry without a value matches any
//! value). The limit found applies only when it sits at the descriptor's last entry; a request
//! with more or fewer entries than the path to a limit matches nothing.

use std::sync::Arc;

use super::config::{Node, RateLimit, RlsConfig};

/// A descriptor matched to a limit.
#[derive(Debug, Clone)]
pub(crate) struct Matched {
    pub(crate) limit: Arc<RateLimit>,
    /// The engine key: domain and entries (a `share_threshold` entry by its pattern), so every
    /// distinct value has its own counter, as upstream's cache key does.
    pub(crate) key: String,
    /// The stats key: the limit's full key, or the detailed / value-to-metric one.
    pub(crate) stat_key: String,
    /// The engine plan, when it is not the config's plan for the limit (a limit override).
    pub(crate) plan: Option<crate::PlanId>,
}

impl Matched {
    /// Whether the stats key carries values the request chose (a limit override's own key, a
    /// `detailed_metric` or `value_to_metric` key): keys of the config's limits alone are
    /// bounded by the config.
    pub(crate) fn stats_by_client(&self) -> bool {
        self.plan.is_some() || self.stat_key != self.limit.full_key
    }
}

/// The engine key of `entries` in `domain` (as [`RlsConfig::get_limit`] builds it for entries
/// that no `share_threshold` folds).
pub(crate) fn plain_key(domain: &str, entries: &[Entry<'_>]) -> String {
    let mut key = String::from(domain);
    for (k, v) in entries {
        key.push('\u{1f}');
        key.push_str(k);
        key.push('\u{1e}');
        key.push_str(v);
    }
    key
}

/// Upstream's stats key of a descriptor with a limit override: `domain.key_value.key…`.
pub(crate) fn descriptor_key(domain: &str, entries: &[Entry<'_>]) -> String {
    let mut out = String::from(domain);
    for (k, v) in entries {
        out.push('.');
        out.push_str(k);
        if !v.is_empty() {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

/// One descriptor entry: key and value.
pub(crate) type Entry<'a> = (&'a str, &'a str);

impl RlsConfig {
    /// Whether `domain` is configured.
    pub(crate) fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit `entries` fall under in `domain`, if any.
    pub(crate) fn get_limit(&self, domain: &str, entries: &[Entry<'_>]) -> Option<Matched> {
        let root = self.domains.get(domain)?;
        let mut level: &Node = root;
        let mut found: Option<Arc<RateLimit>> = None;
        let mut detailed = String::from(domain);
        let mut to_metric = String::from(domain);
        let mut key = String::with_capacity(64);
        key.push_str(domain);
        for (i, &(k, v)) in entries.iter().enumerate() {
            let key_value = format!("{k}_{v}");
            detailed.push('.');
            detailed.push_str(&key_value);
            let mut next = level.children.get(&key_value);
            let mut wildcard: Option<&str> = None;
            if next.is_none() {
                if let Some((_, child)) = level
                    .wildcards
                    .iter()
                    .find(|(prefix, _)| key_value.starts_with(prefix.as_str()))
                {
                    next = level.children.get(child);
                    wildcard = Some(child);
                }
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = level.children.get(k);
            }
            to_metric.push('.');
            key.push('\u{1f}');
            key.push_str(k);
            key.push('\u{1e}');
            match (next, wildcard) {
                (Some(n), Some(pattern)) => {
                    if n.value_to_metric && !n.share_threshold {
                        to_metric.push_str(&key_value);
                    } else {
                        to_metric.push_str(pattern);
                    }
                    if n.share_threshold {
                        key.push_str(pattern);
                    } else {
                        key.push_str(v);
                    }
                }
                (Some(n), None) => {
                    if by_value || n.value_to_metric {
                        to_metric.push_str(k);
                        if !v.is_empty() {
                            to_metric.push('_');
                            to_metric.push_str(v);
                        }
                    } else {
                        to_metric.push_str(k);
                    }
                    key.push_str(v);
                }
                (None, _) => {
                    to_metric.push_str(k);
                    key.push_str(v);
                }
            }
            let Some(n) = next else { break };
            if let Some(l) = &n.limit {
                if i == entries.len() - 1 {
                    found = Some(l.clone());
                }
            }
            if n.children.is_empty() {
                break;
            }
            level = n;
        }
        let limit = found?;
        let stat_key = if limit.detailed_metric {
            detailed
        } else {
            to_metric
        };
        Some(Matched {
            limit,
            key,
            stat_key,
            plan: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "
domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: baz
        value: shady
        rate_limit: {unit: minute, requests_per_unit: 1}
        shadow_mode: true
  - key: qux
    rate_limit: {unlimited: true}
  - key: path
    value: /api*
    rate_limit: {unit: hour, requests_per_unit: 7}
";

    fn config() -> RlsConfig {
        RlsConfig::from_sources(&[("example.yaml".into(), EXAMPLE.into())]).unwrap()
    }

    fn full_key(c: &RlsConfig, entries: &[Entry<'_>]) -> Option<String> {
        c.get_limit("rl", entries).map(|m| m.limit.full_key.clone())
    }

    #[test]
    fn key_value_then_wildcard_then_key_only() {
        let c = config();
        assert_eq!(full_key(&c, &[("foo", "x")]).as_deref(), Some("rl.foo"));
        assert_eq!(
            full_key(&c, &[("foo", "x"), ("bar", "banned")]).as_deref(),
            Some("rl.foo.bar_banned")
        );
        assert_eq!(
            full_key(&c, &[("foo", "x"), ("bar", "other")]).as_deref(),
            Some("rl.foo.bar")
        );
        assert_eq!(
            full_key(&c, &[("path", "/api/v1")]).as_deref(),
            Some("rl.path_/api*")
        );
        assert_eq!(full_key(&c, &[("path", "/web")]), None);
        // A path to a limit must be matched to its end, and no further.
        assert_eq!(full_key(&c, &[("source_cluster", "proxy")]), None);
        assert_eq!(
            full_key(
                &c,
                &[("source_cluster", "proxy"), ("destination_cluster", "mock")]
            )
            .as_deref(),
            Some("rl.source_cluster_proxy.destination_cluster_mock")
        );
        assert_eq!(full_key(&c, &[("qux", "1"), ("more", "2")]), None);
        assert_eq!(c.get_limit("other", &[("foo", "x")]).map(|_| ()), None);
    }

    #[test]
    fn every_value_has_its_own_key_and_the_stats_key_is_the_config_path() {
        let c = config();
        let a = c.get_limit("rl", &[("foo", "a"), ("bar", "1")]).unwrap();
        let b = c.get_limit("rl", &[("foo", "b"), ("bar", "1")]).unwrap();
        assert_ne!(a.key, b.key);
        assert_eq!(a.stat_key, "rl.foo.bar");
        assert_eq!(b.stat_key, "rl.foo.bar");
        let w = c.get_limit("rl", &[("path", "/api/v2")]).unwrap();
        assert_eq!(w.stat_key, "rl.path_/api*");
    }
}
