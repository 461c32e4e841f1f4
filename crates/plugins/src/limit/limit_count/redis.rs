//! The `redis` and `redis-cluster` policies: one script round trip per request (the
//! connections are [`crate::support::redis`]'s).
//!
//! The fixed-window script takes the counter key (`plugin-limit-count:v1:<counter key>`), the
//! window and the cost: a key without a TTL is (re)created with the cost and the window as its
//! expiry, otherwise it is incremented; it answers the consumed count and the remaining TTL in
//! milliseconds. The script is sent by SHA (`EVALSHA`) and loaded on `NOSCRIPT`.

use std::sync::OnceLock;

use redis::Script;

use super::local::{sliding_decide, Outcome};
use crate::support::redis::Remote;

fn fixed_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    // KEYS[1] counter; ARGV[1] window (s); ARGV[2] cost. Answers {consumed, ttl in ms}.
    S.get_or_init(|| {
        Script::new(
            "local left = redis.call('pttl', KEYS[1])\n\
             if left < 0 then\n\
               redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[1])\n\
               return {tonumber(ARGV[2]), tonumber(ARGV[1]) * 1000}\n\
             end\n\
             return {redis.call('incrby', KEYS[1], ARGV[2]), left}\n",
        )
    })
}

fn sliding_script() -> &'static Script {
    static S: OnceLock<Script> = OnceLock::new();
    // KEYS[1] current window's counter; ARGV: cost, limit, window (ms), remaining (ms),
    // expiry (s), previous window's count. Decides and increments atomically (only on accept).
    // Answers {accepted, current count, previous count (capped at the limit)}.
    S.get_or_init(|| {
        Script::new(
            "local cost = tonumber(ARGV[1])\n\
             local limit = tonumber(ARGV[2])\n\
             local window = tonumber(ARGV[3])\n\
             local remaining = tonumber(ARGV[4])\n\
             local prev = math.min(tonumber(ARGV[6]), limit)\n\
             local left = redis.call('pttl', KEYS[1])\n\
             local cur = 0\n\
             if left >= 0 then cur = tonumber(redis.call('get', KEYS[1]) or 0) end\n\
             if cur >= limit or prev / window * remaining + cur >= limit then\n\
               return {0, cur, prev}\n\
             end\n\
             if left < 0 then\n\
               redis.call('set', KEYS[1], cost, 'EX', ARGV[5])\n\
               return {1, cost, prev}\n\
             end\n\
             return {1, redis.call('incrby', KEYS[1], cost), prev}\n",
        )
    })
}

impl Remote {
    /// The fixed window on the server: `counter_key` is the whole key
    /// (`plugin-limit-count:v1:...`).
    pub async fn fixed(
        &self,
        counter_key: &str,
        limit: u64,
        window_s: u64,
        cost: u64,
    ) -> Result<Outcome, String> {
        let (consumed, ttl_ms): (i64, i64) = self
            .invoke(fixed_script().key(counter_key).arg(window_s).arg(cost))
            .await?;
        let reset_centis = (ttl_ms.max(0) as u64) / 10;
        let remaining = limit as i64 - consumed;
        if remaining < 0 {
            return Ok(Outcome {
                rejected: true,
                remaining: 0,
                reset_centis,
            });
        }
        Ok(Outcome {
            rejected: false,
            remaining: remaining as u64,
            reset_centis,
        })
    }

    /// The sliding window on the server: `base` is `plugin-limit-count:<counter key>`; the
    /// counters are `<base>.<window id>.counter`.
    pub async fn sliding(
        &self,
        base: &str,
        limit: u64,
        window_s: u64,
        cost: u64,
        now: u64,
    ) -> Result<Outcome, String> {
        let window_ms = window_s.max(1) * 1000;
        let wid = now / window_ms;
        let remaining_ms = window_ms - now % window_ms;
        let current = format!("{base}.{wid}.counter");
        let previous = format!("{base}.{}.counter", wid.saturating_sub(1));
        let expiry = window_s.max(1) * 2;
        // The previous window is frozen, so reading it outside the script is safe and keeps
        // the script to one key, as a cluster requires.
        let prev: Option<i64> = self.query(redis::cmd("GET").arg(&previous)).await?;
        let prev = prev.unwrap_or(0).max(0) as u64;
        let (accepted, count, prev): (i64, i64, i64) = self
            .invoke(
                sliding_script()
                    .key(&current)
                    .arg(cost)
                    .arg(limit)
                    .arg(window_ms)
                    .arg(remaining_ms)
                    .arg(expiry)
                    .arg(prev),
            )
            .await?;
        let (count, prev) = (count.max(0) as u64, prev.max(0) as u64);
        if accepted == 0 {
            // The script's verdict; recomputed here for the reset time.
            let mut o = sliding_decide(count, prev, limit, cost, window_ms, remaining_ms);
            o.rejected = true;
            o.remaining = 0;
            return Ok(o);
        }
        // `count` already includes this request.
        Ok(sliding_decide(
            count.saturating_sub(cost),
            prev,
            limit,
            cost,
            window_ms,
            remaining_ms,
        ))
    }
}
