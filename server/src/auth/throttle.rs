//! Throttling of password sign-in, against guessing.
//!
//! Failures are counted per username *at one client address*, and per address alone (which
//! catches one address trying many usernames). A key's first few failures cost nothing; after
//! that each attempt must wait twice as long as the one before, up to a cap, and an attempt
//! that comes early is refused without checking the password. A success clears its
//! username-at-address key.
//!
//! Keying by address is what keeps this from becoming a lock-out tool: someone guessing a
//! user's password from one address slows down only that address, never the user signing in
//! from elsewhere, and even there the wait is capped and forgotten after an idle hour.
//! The state is in memory, per replica: behind several replicas a guesser gets each
//! replica's allowance, which still bounds the rate.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// How many failures are free and how the wait grows after them.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Failures of one username from one address before waits start.
    pub free_per_user: u32,
    /// Failures from one address, across usernames, before waits start.
    pub free_per_address: u32,
    /// The first wait; each further failure doubles it.
    pub first_wait: Duration,
    /// The longest wait.
    pub max_wait: Duration,
    /// A key idle this long is forgotten.
    pub forget_after: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            free_per_user: 5,
            free_per_address: 50,
            first_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(15 * 60),
            forget_after: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    UserAt { username: String, address: String },
    Address(String),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// Entries kept before idle ones are swept (one per recent failing username and address).
const SWEEP_ABOVE: usize = 10_000;

/// Sign-in failures by username-at-address and by address.
#[derive(Debug, Default)]
pub struct SignInThrottle {
    policy: Policy,
    failures: Mutex<HashMap<Key, Failures>>,
}

impl SignInThrottle {
    /// A throttle with `policy`.
    pub fn new(policy: Policy) -> Self {
        Self { policy, failures: Mutex::default() }
    }

    /// `Err(wait)` when `username` may not try again from `address` before `wait` has passed.
    pub fn check(&self, username: &str, address: &str, now: Instant) -> Result<(), Duration> {
        let failures = self.lock();
        let waits = [
            (Key::user_at(username, address), self.policy.free_per_user),
            (Key::Address(address.to_owned()), self.policy.free_per_address),
        ]
        .map(|(key, free)| failures.get(&key).map_or(Duration::ZERO, |f| self.remaining(*f, free, now)));
        let wait = waits[0].max(waits[1]);
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    /// Records a wrong password (or unknown username) for `username` from `address`.
    pub fn failed(&self, username: &str, address: &str, now: Instant) {
        let mut failures = self.lock();
        if failures.len() > SWEEP_ABOVE {
            let forget = self.policy.forget_after;
            failures.retain(|_, f| now.saturating_duration_since(f.last) < forget);
        }
        for key in [Key::user_at(username, address), Key::Address(address.to_owned())] {
            let entry = failures.entry(key).or_insert(Failures { count: 0, last: now });
            if now.saturating_duration_since(entry.last) >= self.policy.forget_after {
                entry.count = 0;
            }
            entry.count = entry.count.saturating_add(1);
            entry.last = now;
        }
    }

    /// Records a successful sign-in: `username` starts afresh at `address`.
    pub fn succeeded(&self, username: &str, address: &str) {
        self.lock().remove(&Key::user_at(username, address));
    }

    /// How long a key with `f` failures, `free` of them free, must still wait at `now`.
    fn remaining(&self, f: Failures, free: u32, now: Instant) -> Duration {
        let idle = now.saturating_duration_since(f.last);
        if f.count < free || idle >= self.policy.forget_after {
            return Duration::ZERO;
        }
        let doublings = (f.count - free).min(30);
        let wait = self.policy.first_wait.saturating_mul(1 << doublings).min(self.policy.max_wait);
        wait.saturating_sub(idle)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Failures>> {
        // The map holds counters only; one left by a panicking holder is still usable.
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Key {
    fn user_at(username: &str, address: &str) -> Self {
        Key::UserAt { username: username.to_owned(), address: address.to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> SignInThrottle {
        SignInThrottle::new(Policy {
            free_per_user: 3,
            free_per_address: 10,
            first_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(8),
            forget_after: Duration::from_secs(60),
        })
    }

    #[test]
    fn waits_start_after_the_free_failures_double_and_stop_at_the_cap() {
        let t = throttle();
        let start = Instant::now();
        for _ in 0..3 {
            assert_eq!(t.check("ann", "10.0.0.1", start), Ok(()));
            t.failed("ann", "10.0.0.1", start);
        }
        assert_eq!(t.check("ann", "10.0.0.1", start), Err(Duration::from_secs(1)));
        let mut now = start;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let wait = t.check("ann", "10.0.0.1", now).expect_err("waiting");
            waits.push(wait.as_secs());
            now += wait;
            assert_eq!(t.check("ann", "10.0.0.1", now), Ok(()), "allowed once the wait is over");
            t.failed("ann", "10.0.0.1", now);
        }
        assert_eq!(waits, [1, 2, 4, 8, 8, 8]);
    }

    #[test]
    fn a_guesser_at_one_address_never_slows_the_user_at_another() {
        let t = throttle();
        let now = Instant::now();
        for _ in 0..20 {
            t.failed("ann", "203.0.113.9", now);
        }
        assert!(t.check("ann", "203.0.113.9", now).is_err());
        assert_eq!(t.check("ann", "10.0.0.1", now), Ok(()));
    }

    #[test]
    fn one_address_trying_many_usernames_is_slowed_too() {
        let t = throttle();
        let now = Instant::now();
        for i in 0..10 {
            t.failed(&format!("user{i}"), "203.0.113.9", now);
        }
        assert!(t.check("someone-new", "203.0.113.9", now).is_err());
        assert_eq!(t.check("someone-new", "10.0.0.1", now), Ok(()));
    }

    #[test]
    fn success_clears_the_user_at_that_address_and_idle_keys_are_forgotten() {
        let t = throttle();
        let now = Instant::now();
        for _ in 0..5 {
            t.failed("ann", "10.0.0.1", now);
        }
        t.succeeded("ann", "10.0.0.1");
        assert_eq!(t.check("ann", "10.0.0.1", now), Ok(()));
        for _ in 0..5 {
            t.failed("bob", "10.0.0.2", now);
        }
        assert!(t.check("bob", "10.0.0.2", now).is_err());
        assert_eq!(t.check("bob", "10.0.0.2", now + Duration::from_secs(60)), Ok(()));
    }
}
