//! An integer token bucket that answers "when will `n` tokens be there?".
//!
//! Tokens are held in nano-tokens (1 token = 10^9), so refilling for a whole
//! number of nanoseconds at an integer rate (tokens/s) is exact, and the
//! fraction left over by a rounded-up wait is kept, not lost: pacing never
//! drifts however long it runs.
//!
//! Reservation style (as in a virtual-clock scheduler): a request that must wait
//! reserves its tokens now and completes at a computed time; the bucket's own
//! time moves to that point, so later requests queue behind it.

/// Nano-tokens per token.
pub const NANO: u128 = 1_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Refill rate, tokens per second.
    rate: u64,
    /// Capacity in nano-tokens.
    cap: u128,
    /// Nano-tokens held at time `at`.
    tokens: u128,
    /// Nanoseconds on the model's clock; may lie in the future (reserved).
    at: u64,
}

impl Bucket {
    /// A bucket refilling at `rate` tokens/s, holding at most `capacity` tokens,
    /// with `initial` tokens at time `now_ns`.
    pub fn new(rate: u64, capacity: u64, initial: u64, now_ns: u64) -> Self {
        let cap = capacity as u128 * NANO;
        Bucket { rate, cap, tokens: (initial as u128 * NANO).min(cap), at: now_ns }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Capacity in whole tokens.
    pub fn capacity(&self) -> u64 {
        (self.cap / NANO) as u64
    }

    /// Nano-tokens at time `t` (idle accumulation, capped); `t` before the
    /// bucket's own time gives the tokens at its own time.
    fn nano_at(&self, t: u64) -> u128 {
        if t <= self.at {
            return self.tokens;
        }
        (self.tokens + self.rate as u128 * (t - self.at) as u128).min(self.cap.max(self.tokens))
    }

    /// Whole tokens available at `t` (after every reservation made so far).
    pub fn balance(&self, t: u64) -> u64 {
        (self.nano_at(t) / NANO) as u64
    }

    /// Whether at least one whole token is available at `t`.
    pub fn has_token(&self, t: u64) -> bool {
        self.nano_at(t) >= NANO
    }

    /// Earliest time (ns) at which `n` tokens can be taken by a request made at
    /// `now`. `u64::MAX` if the bucket never refills and lacks them.
    pub fn ready(&self, now: u64, n: u64) -> u64 {
        let start = now.max(self.at);
        let have = self.nano_at(start);
        let need = n as u128 * NANO;
        if have >= need {
            return start;
        }
        if self.rate == 0 {
            return u64::MAX;
        }
        let wait = (need - have).div_ceil(self.rate as u128);
        start.saturating_add(wait.min(u64::MAX as u128) as u64)
    }

    /// Take `n` tokens at time `at` (>= `ready(now, n)`) for a request made at `now`.
    pub fn take(&mut self, now: u64, at: u64, n: u64) {
        let start = now.max(self.at);
        debug_assert!(at >= start);
        let have = self.nano_at(start);
        let need = n as u128 * NANO;
        let avail = have + self.rate as u128 * (at.max(start) - start) as u128;
        // Refill beyond the cap is lost, except up to one nanosecond's worth: the
        // wait was rounded up to whole ns and that surplus belongs to the next
        // request (else pacing drifts). A request larger than the capacity
        // accumulates past the cap while it waits: those tokens are its own.
        let slack = self.cap + self.rate as u128;
        self.tokens = if need <= self.cap { avail.min(slack.max(have)) - need } else { (avail - need).min(slack) };
        self.at = at.max(start);
    }

    /// Change rate and capacity from `now` on, keeping the balance (clamped to
    /// the new capacity).
    pub fn update(&mut self, now: u64, rate: u64, capacity: u64) {
        let t = now.max(self.at);
        self.tokens = self.nano_at(t);
        self.at = t;
        self.rate = rate;
        self.cap = capacity as u128 * NANO;
        self.tokens = self.tokens.min(self.cap);
    }

    /// Set the balance to `tokens` (clamped) at `now`.
    pub fn set_balance(&mut self, now: u64, tokens: u64) {
        self.at = now.max(self.at);
        self.tokens = (tokens as u128 * NANO).min(self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn paces_at_the_rate_without_drift() {
        // 3 tokens/s: 1/3 s is not a whole number of ns, the remainder must carry.
        let mut b = Bucket::new(3, 1, 1, 0);
        let mut t = 0;
        for _ in 0..3_000 {
            t = b.ready(0, 1);
            b.take(0, t, 1);
        }
        // Token k (0-based) is ready at ceil(k/3 s): token 2999 at 999.666.. s.
        assert_eq!(t, (2_999 * S).div_ceil(3));
        assert_eq!(b.ready(0, 1), 1_000 * S, "token 3000 exactly at 1000 s");
    }

    #[test]
    fn idle_refill_is_capped() {
        let mut b = Bucket::new(10, 5, 0, 0);
        assert_eq!(b.balance(100 * S), 5);
        b.take(100 * S, 100 * S, 5);
        assert_eq!(b.balance(100 * S), 0);
        assert_eq!(b.ready(100 * S, 1), 100 * S + S / 10);
    }

    #[test]
    fn request_larger_than_capacity_waits_for_the_excess() {
        let mut b = Bucket::new(4, 1, 1, 0);
        // 9 tokens, 1 held: 8 more at 4/s = 2 s.
        assert_eq!(b.ready(0, 9), 2 * S);
        b.take(0, 2 * S, 9);
        assert_eq!(b.balance(2 * S), 0);
    }

    #[test]
    fn update_keeps_balance_clamped() {
        let mut b = Bucket::new(1, 100, 100, 0);
        b.update(0, 5, 10);
        assert_eq!(b.balance(0), 10);
        assert_eq!(b.rate(), 5);
        b.take(0, 0, 10);
        assert_eq!(b.ready(0, 5), S);
    }

    #[test]
    fn zero_rate_never_refills() {
        let b = Bucket::new(0, 10, 2, 0);
        assert_eq!(b.ready(0, 2), 0);
        assert_eq!(b.ready(0, 3), u64::MAX);
    }
}
