//! Brute-force protection for logins, without the race of a check-then-increment counter.
//!
//! The usual code checks `attempts >= 5` and later increments: two concurrent guesses both pass the
//! check. Here an attempt is charged *before* the password is verified, in one all-or-nothing
//! step against two limits: per (ip, username) and per ip. A success clears only that
//! (ip, username) pair, so an attacker who owns one account cannot launder the failures it
//! spent on others, nor the per-ip budget.

use std::net::IpAddr;
use std::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::ip::{DEFAULT_V6_PREFIX, client_ip_key};
use crate::limiter::{Limiter, check_all};
use crate::quota::{Algorithm, Quota};

/// Counts login attempts per (ip, username) and per ip, with a lockout.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::{FakeClock, LoginGuard};
/// let guard = LoginGuard::recommended(FakeClock::new()).unwrap();
/// let ip: IpAddr = "198.51.100.4".parse().unwrap();
/// for _ in 0..5 {
///     assert!(guard.attempt(ip, "alice").is_allowed()); // 5 tries in 5 minutes
/// }
/// let locked = guard.attempt(ip, "alice");
/// assert!(!locked.is_allowed());
/// assert_eq!(locked.retry_after().as_secs(), 300); // the lockout
/// ```
pub struct LoginGuard<C: Clock = MonotonicClock> {
    pair: Limiter<(IpAddr, String), C>,
    ip: Limiter<IpAddr, C>,
    lockout: Duration,
}

impl<C: Clock + Clone> LoginGuard<C> {
    /// The usual numbers for a login form: 5 attempts per 5 minutes per (ip, username), 20 per 5
    /// minutes per ip
    /// (sliding window logs: exact), and a 5-minute lockout when a pair runs out.
    pub fn recommended(clock: C) -> Result<Self, Error> {
        let five_min = Duration::from_secs(300);
        Self::new(
            Quota::new(5, five_min).algorithm(Algorithm::SlidingWindowLog),
            Quota::new(20, five_min).algorithm(Algorithm::SlidingWindowLog),
            five_min,
            clock,
        )
    }

    /// A guard with the given per-pair and per-ip quotas and lockout.
    pub fn new(per_pair: Quota, per_ip: Quota, lockout: Duration, clock: C) -> Result<Self, Error> {
        Ok(LoginGuard {
            pair: Limiter::builder()
                .quota(per_pair)
                .clock(clock.clone())
                .build()?,
            ip: Limiter::builder().quota(per_ip).clock(clock).build()?,
            lockout,
        })
    }

    /// Call before verifying a password: charges one attempt to both limits, all or nothing.
    /// Denied when either is spent; a pair that runs out is locked for the lockout period.
    pub fn attempt(&self, ip: IpAddr, username: &str) -> Decision {
        let ip = client_ip_key(ip, DEFAULT_V6_PREFIX);
        let pair = (ip, username.to_string());
        let d = check_all(&[&self.pair.key(&pair), &self.ip.key(&ip)], 1)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0));
        if !d.allowed && d.reason == Reason::Limited && !self.pair.peek(&pair).is_allowed() {
            let _ = self.pair.block(&pair, self.lockout);
            let blocked = self.pair.peek(&pair);
            return Decision {
                retry_after_ns: blocked.retry_after_ns,
                ..d
            };
        }
        d
    }

    /// Call after a successful login: forgets this pair's attempts (and any lockout of it).
    /// The per-ip count and every other pair stay as they are.
    pub fn succeeded(&self, ip: IpAddr, username: &str) {
        let ip = client_ip_key(ip, DEFAULT_V6_PREFIX);
        self.pair.reset(&(ip, username.to_string()));
    }
}

impl<C: Clock + std::fmt::Debug> std::fmt::Debug for LoginGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginGuard")
            .field("pair", &self.pair)
            .field("ip", &self.ip)
            .field("lockout", &self.lockout)
            .finish()
    }
}
