//! Settings that cannot take effect and are no construction error (an error would break a
//! valid use, or the hook that decides comes after construction): listed by
//! [`RateLimitLayer::warnings`], logged once with the `tracing` feature.

use super::RateLimitLayer;
use crate::clock::Clock;
use crate::http::config::KeySource;

/// The warning for `user` among the key sources with no user extractor.
pub(super) const NO_USER_FN: &str = "`http.key` includes \"user\" but no user extractor is set (`.user`): \
     every request is keyed as one without a user (`on_bad_key`)";

impl<C: Clock> RateLimitLayer<C> {
    /// Settings of this layer that cannot take effect, in words: a user extractor that is never
    /// called (no key source is `user`, or a custom key extractor keys every request), `user`
    /// among the key sources with no user extractor, a resolver beside a non-empty `api_keys`
    /// table (the resolver replaces it). Empty when every setting applies. With the `tracing`
    /// feature each is also logged once as a warning (target `tollgate`): when the hook that
    /// makes it is set, or for a missing user extractor at the first request without a user.
    ///
    /// ```
    /// use tollgate::http::{HttpConfig, RateLimitLayer};
    /// let config = HttpConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1m\"\n[http]\nkey = \"ip\"\n")?;
    /// let layer = RateLimitLayer::new(config)?.user(|_| Some("bob"));
    /// assert_eq!(layer.warnings(), [
    ///     "the user extractor (`.user`) is never called: `http.key` is [\"ip\"], without \"user\"",
    /// ]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn warnings(&self) -> Vec<String> {
        self.current()
            .warnings_by_hook()
            .into_iter()
            .map(|(_, w)| w)
            .collect()
    }

    /// [`warnings`](Self::warnings), each with the hooks whose setting makes it.
    fn warnings_by_hook(&self) -> Vec<(&'static [&'static str], String)> {
        let c = &self.shared.core.config;
        let h = &self.shared.hooks;
        let mut out: Vec<(&'static [&'static str], String)> = Vec::new();
        if h.user.is_some() && h.key.is_some() {
            out.push((
                &["user", "key_extractor"],
                "the user extractor (`.user`) is never called: the key extractor \
                 (`.key_extractor`) keys every request"
                    .into(),
            ));
        } else if h.user.is_some() && !c.key.contains(&KeySource::User) {
            let names: Vec<String> = c.key.iter().map(|k| format!("{:?}", k.name())).collect();
            out.push((
                &["user"],
                format!(
                    "the user extractor (`.user`) is never called: `http.key` is [{}], without \"user\"",
                    names.join(", ")
                ),
            ));
        } else if h.user.is_none() && h.key.is_none() && c.key.contains(&KeySource::User) {
            out.push((&[], NO_USER_FN.into()));
        }
        if h.resolver.is_some() && !c.api_keys.is_empty() {
            out.push((
                &["resolver"],
                format!(
                    "the resolver (`.resolver`) replaces the `http.api_keys` table: its {} key(s) \
                     are never read",
                    c.api_keys.len()
                ),
            ));
        }
        out
    }

    /// Logs the warnings that setting `hook` made (feature `tracing`).
    pub(super) fn warn_new(&self, hook: &str) {
        #[cfg(feature = "tracing")]
        for (hooks, warning) in self.warnings_by_hook() {
            if hooks.contains(&hook) {
                tracing::warn!(target: "tollgate", "{warning}");
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = hook;
    }
}
