//! Where a limiter's decisions are made: in process, or through Redis (feature `redis`), synced
//! (the engine decides here, the rounds reconcile with Redis) or exact (a script decides each
//! call on Redis). The limiter's face asks this seam, never the Redis types themselves.

use super::book::Book;
use crate::error::Error;
use crate::plan::Plan;

/// A limiter's backend: in process unless one of the Redis modes is set.
pub(crate) struct Backend<K> {
    /// Synced through Redis: the trackers and the rounds' Redis side.
    #[cfg(feature = "redis")]
    pub(crate) synced: Option<super::synced::Synced<K>>,
    /// Exact mode: each plan's Redis limiter.
    #[cfg(feature = "redis")]
    pub(crate) exact: Option<super::exact::Exact<K>>,
    #[cfg(not(feature = "redis"))]
    keys: std::marker::PhantomData<fn(K)>,
}

impl<K> Backend<K> {
    /// The in-process backend (a Redis mode is set by the builder once the limiter exists).
    pub(crate) fn in_process() -> Self {
        Backend {
            #[cfg(feature = "redis")]
            synced: None,
            #[cfg(feature = "redis")]
            exact: None,
            #[cfg(not(feature = "redis"))]
            keys: std::marker::PhantomData,
        }
    }

    /// Synced through Redis.
    #[inline]
    pub(crate) fn is_synced(&self) -> bool {
        #[cfg(feature = "redis")]
        {
            self.synced.is_some()
        }
        #[cfg(not(feature = "redis"))]
        {
            false
        }
    }

    /// In Redis exact mode.
    #[inline]
    pub(crate) fn is_exact(&self) -> bool {
        #[cfg(feature = "redis")]
        {
            self.exact.is_some()
        }
        #[cfg(not(feature = "redis"))]
        {
            false
        }
    }

    /// A plan change (`plans`, compiled to `book`) as the backend must see it before it is
    /// installed: synced mode refuses what it cannot sync; exact mode loads the new plans'
    /// scripts. An error leaves everything as it was.
    pub(crate) fn plans_changed(&self, plans: &[(String, Plan)], book: &Book) -> Result<(), Error> {
        #[cfg(feature = "redis")]
        {
            if self.synced.is_some() {
                super::synced::check_rules(&book.rules)?;
            }
            if let Some(x) = &self.exact {
                x.install(plans, &book.by_name)?;
            }
        }
        #[cfg(not(feature = "redis"))]
        let _ = (plans, book);
        Ok(())
    }
}
