//! Which arguments of a redis command are keys, for `conf.faults`' `key`: the table APISIX's
//! `apisix/stream/xrpc/protocols/redis/commands.lua` derived from redis' `COMMAND INFO`
//! (first key, last key, step). A command not listed takes its first argument as the key.

/// Where a command's keys are; `idx` counts the command itself as 1, `narg` is every
/// argument with the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyFinder {
    /// 1:-1:1 — every argument.
    All,
    /// 1:-1:2 — every other argument from the first (`MSET k v k v`).
    EveryOther,
    /// 1:-2:1 — the arguments before the last two, as APISIX counts (for `BLPOP a b 0`, only
    /// `a`).
    AllButLast,
    /// 1:2:1 — the first two arguments.
    FirstTwo,
    /// 2:-1:1 — every argument from the second.
    FromSecond,
    /// 2:2:1 — the second argument.
    Second,
    /// 3:3:1 — the third argument.
    Third,
    /// The default: the first argument.
    First,
}

impl KeyFinder {
    pub fn is_key(self, idx: usize, narg: usize) -> bool {
        match self {
            KeyFinder::All => idx > 1,
            KeyFinder::EveryOther => idx > 1 && idx % 2 == 0,
            KeyFinder::AllButLast => idx > 1 && idx + 1 < narg,
            KeyFinder::FirstTwo => idx == 2 || idx == 3,
            KeyFinder::FromSecond => idx > 2,
            KeyFinder::Second => idx == 3,
            KeyFinder::Third => idx == 4,
            KeyFinder::First => idx == 2,
        }
    }
}

/// Commands without keys (0:0:0): a fault rule's `key` is ignored for them.
const KEYLESS: &[&str] = &[
    "acl",
    "asking",
    "auth",
    "bgrewriteaof",
    "bgsave",
    "blmpop",
    "bzmpop",
    "client",
    "cluster",
    "command",
    "config",
    "dbsize",
    "debug",
    "discard",
    "echo",
    "eval",
    "eval_ro",
    "evalsha",
    "evalsha_ro",
    "exec",
    "failover",
    "fcall",
    "fcall_ro",
    "flushall",
    "flushdb",
    "function",
    "hello",
    "info",
    "keys",
    "lastsave",
    "latency",
    "lmpop",
    "lolwut",
    "memory",
    "module",
    "monitor",
    "multi",
    "object",
    "pfselftest",
    "ping",
    "psubscribe",
    "psync",
    "publish",
    "pubsub",
    "punsubscribe",
    "quit",
    "randomkey",
    "readonly",
    "readwrite",
    "replconf",
    "replicaof",
    "reset",
    "role",
    "save",
    "scan",
    "script",
    "select",
    "shutdown",
    "sintercard",
    "slaveof",
    "slowlog",
    "subscribe",
    "swapdb",
    "sync",
    "time",
    "unsubscribe",
    "unwatch",
    "wait",
    "xgroup",
    "xinfo",
    "xread",
    "xreadgroup",
    "zdiff",
    "zinter",
    "zintercard",
    "zmpop",
    "zunion",
];

const TABLE: &[(KeyFinder, &[&str])] = &[
    (
        KeyFinder::All,
        &[
            "del",
            "exists",
            "mget",
            "pfcount",
            "pfmerge",
            "sdiff",
            "sdiffstore",
            "sinter",
            "sinterstore",
            "ssubscribe",
            "sunion",
            "sunionstore",
            "sunsubscribe",
            "touch",
            "unlink",
            "watch",
        ],
    ),
    (KeyFinder::EveryOther, &["mset", "msetnx"]),
    (
        KeyFinder::AllButLast,
        &["blpop", "brpop", "bzpopmax", "bzpopmin"],
    ),
    (
        KeyFinder::FirstTwo,
        &[
            "blmove",
            "brpoplpush",
            "copy",
            "geosearchstore",
            "lcs",
            "lmove",
            "rename",
            "renamenx",
            "rpoplpush",
            "smove",
            "zrangestore",
        ],
    ),
    (KeyFinder::FromSecond, &["bitop"]),
    (KeyFinder::Second, &["pfdebug"]),
    (KeyFinder::Third, &["migrate"]),
];

/// Whether a fault rule's `key` applies to `cmd` (lower case): not for keyless commands.
pub fn has_keys(cmd: &str) -> bool {
    !KEYLESS.contains(&cmd)
}

/// The key finder of `cmd` as the client spelled it. APISIX looks the table up with the
/// command's original case, so `MSET` (upper case) gets the default finder while `mset`
/// gets its own; ferrisix keeps that.
pub fn key_finder(cmd: &str) -> KeyFinder {
    TABLE
        .iter()
        .find(|(_, cmds)| cmds.contains(&cmd))
        .map_or(KeyFinder::First, |(f, _)| *f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finders() {
        assert_eq!(key_finder("mset"), KeyFinder::EveryOther);
        assert_eq!(key_finder("MSET"), KeyFinder::First);
        assert_eq!(key_finder("get"), KeyFinder::First);
        assert_eq!(key_finder("ping"), KeyFinder::First);
        assert!(!has_keys("ping"));
        assert!(has_keys("get"));
        // MSET c 1 a 2 b 3: the keys are c, a, b.
        let keys: Vec<usize> = (2..=7)
            .filter(|i| KeyFinder::EveryOther.is_key(*i, 7))
            .collect();
        assert_eq!(keys, vec![2, 4, 6]);
        // BLPOP a b 0: a, as APISIX's finder counts.
        let keys: Vec<usize> = (2..=4)
            .filter(|i| KeyFinder::AllButLast.is_key(*i, 4))
            .collect();
        assert_eq!(keys, vec![2]);
    }
}
