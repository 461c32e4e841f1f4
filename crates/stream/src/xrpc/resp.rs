//! RESP, as APISIX's redis xRPC protocol reads it (`apisix/stream/xrpc/protocols/redis/
//! init.lua`): client commands are arrays of bulk strings (inline commands are not read:
//! their first line is not a length, so the connection is closed), the upstream's replies
//! are RESP2 values (a RESP3 type is an unknown prefix, which also ends the session).
//!
//! Both readers are incremental: bytes come in whatever pieces the sockets give, and a value
//! is never held whole beyond what the command-level view needs. A bulk string longer than
//! [`MAX_VALUE_LEN`] is recorded as its first bytes and its length, and the rest passes
//! through without being kept, so a large value costs no memory here whatever length it
//! declares.

use std::collections::HashMap;

use serde_json::Value;

use super::commands::{self, KeyFinder};

/// The longest length line of a command (APISIX's `MAX_LINE_LEN`).
pub const MAX_LINE_LEN: usize = 128;
/// The most bytes of an argument the command-level view records (APISIX's `MAX_VALUE_LEN`).
pub const MAX_VALUE_LEN: usize = 128;
/// The longest command name or key held whole to be matched against `conf.faults`; a longer
/// one is recorded like a long value and matches no fault key.
const MAX_HELD: usize = 64 * 1024;
/// The most arguments the command-level view records; the rest are counted.
const MAX_RECORDED_ARGS: usize = 256;
/// The longest reply line (a status or error text, a length).
const MAX_REPLY_LINE: usize = 64 * 1024;

/// `conf.faults` compiled: per command (lower case), per key (`*`: any), the delay.
#[derive(Debug, Default)]
pub struct Faults {
    rules: HashMap<String, HashMap<String, f64>>,
}

impl Faults {
    /// APISIX's `create_matcher`: a later rule for the same command and key overrides an
    /// earlier one; a rule without `key`, or for a command without keys, applies to any key.
    pub fn compile(conf: Option<&Value>) -> Option<Faults> {
        let list = conf?.get("faults")?.as_array()?;
        let mut rules: HashMap<String, HashMap<String, f64>> = HashMap::new();
        for rule in list {
            let delay = rule.get("delay").and_then(Value::as_f64).unwrap_or(0.0);
            let key = rule.get("key").and_then(Value::as_str);
            let cmds = rule.get("commands").and_then(Value::as_array);
            for cmd in cmds.into_iter().flatten().filter_map(Value::as_str) {
                let cmd = cmd.to_lowercase();
                let key = match key {
                    Some(k) if commands::has_keys(&cmd) => k.to_string(),
                    _ => "*".to_string(),
                };
                rules.entry(cmd).or_default().insert(key, delay);
            }
        }
        Some(Faults { rules })
    }
}

/// One whole command read from the client.
#[derive(Debug, Default, PartialEq)]
pub struct Command {
    /// The command name, lower case (the metrics' `command` label).
    pub cmd: String,
    /// The command and its arguments as recorded (`$redis_cmd_line`).
    pub cmd_line: Vec<String>,
    /// The fault delay, in seconds, to wait before the command goes upstream.
    pub delay: Option<f64>,
    /// `SUBSCRIBE` or `PSUBSCRIBE`: the session reads replies as pub/sub messages from now.
    pub subscribes: bool,
}

#[derive(Debug, Default)]
enum ReqState {
    /// The `*<n>` line.
    #[default]
    Narg,
    /// An argument's `$<n>` line.
    ArgLen,
    /// An argument's `n` bytes and CRLF.
    Body(usize),
    /// The rest of a long argument, not recorded.
    Skip(u64),
}

/// Reads client commands.
#[derive(Debug, Default)]
pub struct RequestParser {
    state: ReqState,
    narg: usize,
    /// The argument being read, counting the command as 1.
    idx: usize,
    current: Command,
    /// The command's fault rules, while a key may still pick one.
    rules: Option<String>,
    key_finder: Option<KeyFinder>,
    matched: Option<f64>,
}

/// A line up to `\n` (without it and a `\r` before it) starting at `data[pos]`: `Ok(None)`
/// when more bytes are needed.
fn line(data: &[u8], pos: usize, max: usize) -> Result<Option<(&[u8], usize)>, String> {
    let rest = &data[pos..];
    let window = &rest[..rest.len().min(max + 2)];
    match window.iter().position(|b| *b == b'\n') {
        Some(i) => {
            let mut l = &rest[..i];
            if l.last() == Some(&b'\r') {
                l = &l[..l.len() - 1];
            }
            Ok(Some((l, pos + i + 1)))
        }
        None if rest.len() >= max + 2 => Err("line too long".into()),
        None => Ok(None),
    }
}

/// APISIX's `read_len`: the line's first byte is skipped whatever it is, the rest must be a
/// plain decimal integer.
fn read_len(l: &[u8]) -> Result<i64, String> {
    if l.len() < 2 {
        return Err("line too short".into());
    }
    let s = &l[1..];
    let digits = s.strip_prefix(b"-").unwrap_or(s);
    let text = String::from_utf8_lossy(s);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(format!("invalid len string: \"{text}\""));
    }
    text.parse::<i64>()
        .map_err(|_| format!("invalid len string: \"{text}\""))
}

impl RequestParser {
    /// Reads from `data` up to the end of one command: the bytes consumed (everything up to
    /// where it stopped; they may go upstream) and the command when one ended. An error
    /// (malformed RESP) ends the session.
    pub fn parse(
        &mut self,
        data: &[u8],
        faults: Option<&Faults>,
    ) -> Result<(usize, Option<Command>), String> {
        let mut pos = 0;
        loop {
            match self.state {
                ReqState::Narg => {
                    let Some((l, next)) = line(data, pos, MAX_LINE_LEN)? else {
                        return Ok((pos, None));
                    };
                    let n = read_len(l)?;
                    if n < 1 {
                        return Err(format!("invalid argument number: {n}"));
                    }
                    pos = next;
                    self.narg = usize::try_from(n).unwrap_or(usize::MAX);
                    self.idx = 1;
                    self.current = Command {
                        cmd_line: Vec::with_capacity(self.narg.min(64)),
                        ..Command::default()
                    };
                    self.rules = None;
                    self.key_finder = None;
                    self.matched = None;
                    self.state = ReqState::ArgLen;
                }
                ReqState::ArgLen => {
                    let Some((l, next)) = line(data, pos, MAX_LINE_LEN)? else {
                        return Ok((pos, None));
                    };
                    let n = read_len(l)?;
                    if n < 0 {
                        return Err(format!("invalid bulk length: {n}"));
                    }
                    pos = next;
                    self.state = ReqState::Body(usize::try_from(n).unwrap_or(usize::MAX));
                }
                ReqState::Body(n) => {
                    let is_key = self
                        .key_finder
                        .is_some_and(|f| f.is_key(self.idx, self.narg));
                    let held = if self.idx == 1 || is_key {
                        n <= MAX_HELD
                    } else {
                        n <= MAX_VALUE_LEN
                    };
                    let rest = data.len() - pos;
                    let text = if held {
                        if rest < n + 2 {
                            return Ok((pos, None));
                        }
                        let s = String::from_utf8_lossy(&data[pos..pos + n]).into_owned();
                        pos += n + 2;
                        self.state = ReqState::ArgLen;
                        s
                    } else {
                        // Record the first bytes; the rest passes through unrecorded.
                        if rest < MAX_VALUE_LEN {
                            return Ok((pos, None));
                        }
                        let s = format!(
                            "{}...({n} bytes)",
                            String::from_utf8_lossy(&data[pos..pos + MAX_VALUE_LEN])
                        );
                        pos += MAX_VALUE_LEN;
                        let left = (n - MAX_VALUE_LEN) as u64 + 2;
                        self.state = ReqState::Skip(left);
                        s
                    };
                    self.take_arg(text, held && is_key, faults);
                    if !held {
                        // The argument ends after its unrecorded rest.
                        continue;
                    }
                    if let Some(done) = self.arg_done(faults) {
                        return Ok((pos, Some(done)));
                    }
                }
                ReqState::Skip(left) => {
                    let take = left.min((data.len() - pos) as u64);
                    pos += take as usize;
                    if take < left {
                        self.state = ReqState::Skip(left - take);
                        return Ok((pos, None));
                    }
                    self.state = ReqState::ArgLen;
                    if let Some(done) = self.arg_done(faults) {
                        return Ok((pos, Some(done)));
                    }
                }
            }
        }
    }

    fn take_arg(&mut self, s: String, is_key: bool, faults: Option<&Faults>) {
        if self.idx == 1 {
            let cmd = s.to_lowercase();
            self.current.subscribes = cmd == "subscribe" || cmd == "psubscribe";
            if let Some(f) = faults {
                if f.rules.contains_key(&cmd) {
                    self.rules = Some(cmd.clone());
                    self.key_finder = Some(commands::key_finder(&s));
                }
            }
            self.current.cmd = cmd.clone();
            self.current.cmd_line.push(cmd);
            return;
        }
        if is_key {
            let delay = self
                .rules
                .as_ref()
                .and_then(|c| faults?.rules.get(c)?.get(&s).copied());
            if delay.is_some() {
                self.matched = delay;
                self.key_finder = None;
            }
        }
        if self.idx <= MAX_RECORDED_ARGS {
            self.current.cmd_line.push(s);
        }
    }

    /// After an argument: the command when it was the last, with its delay: the rule of the
    /// first key that has one, else the command's rule for any key.
    fn arg_done(&mut self, faults: Option<&Faults>) -> Option<Command> {
        if self.idx < self.narg {
            self.idx += 1;
            return None;
        }
        self.state = ReqState::Narg;
        let mut done = std::mem::take(&mut self.current);
        if self.narg > MAX_RECORDED_ARGS {
            done.cmd_line
                .push(format!("...({} arguments)", self.narg - MAX_RECORDED_ARGS));
        }
        let rules = self.rules.take();
        done.delay = self.matched.take().or_else(|| {
            let cmd = rules?;
            faults?.rules.get(&cmd)?.get("*").copied()
        });
        Some(done)
    }
}

/// What the reply reader needs from the session: whether it is in pub/sub mode.
pub trait ReplySink {
    fn in_pub_sub(&self) -> bool;
    fn reply(&mut self, reply: Reply);
}

/// One whole reply from the upstream.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// Read as a pub/sub message (an array of 3 or 4 while in pub/sub mode).
    pub pubsub: bool,
    /// The message's type (its first element, a bulk string or an integer; `None` for a
    /// null).
    pub pubsub_type: Option<String>,
    /// An `unsubscribe` / `punsubscribe` that left no subscription.
    pub left_pub_sub: bool,
}

/// The pub/sub message being read.
#[derive(Debug, Default)]
struct Message {
    narr: u64,
    kind: Option<String>,
    left: bool,
}

/// Reads the upstream's replies.
#[derive(Debug, Default)]
pub struct ReplyScanner {
    /// Bytes of an unfinished line (or captured element) from earlier reads.
    pending: Vec<u8>,
    /// Elements left in each array being read.
    stack: Vec<u64>,
    /// Bytes of a bulk string (and its CRLF) still to pass.
    skip: u64,
    message: Option<Message>,
}

impl ReplyScanner {
    /// Reads `chunk`, telling `sink` of each reply it ends.
    pub fn feed(&mut self, chunk: &[u8], sink: &mut dyn ReplySink) -> Result<(), String> {
        if self.pending.is_empty() {
            let used = self.scan(chunk, sink)?;
            self.pending.extend_from_slice(&chunk[used..]);
        } else {
            let mut data = std::mem::take(&mut self.pending);
            data.extend_from_slice(chunk);
            let used = self.scan(&data, sink)?;
            data.drain(..used);
            self.pending = data;
        }
        Ok(())
    }

    /// The element at depth 1 of a pub/sub message that starts now, by index.
    fn message_index(&self) -> Option<u64> {
        let m = self.message.as_ref()?;
        (self.stack.len() == 1).then(|| m.narr - self.stack[0])
    }

    fn scan(&mut self, data: &[u8], sink: &mut dyn ReplySink) -> Result<usize, String> {
        let mut pos = 0;
        loop {
            if self.skip > 0 {
                let take = self.skip.min((data.len() - pos) as u64);
                pos += take as usize;
                self.skip -= take;
                if self.skip > 0 {
                    return Ok(pos);
                }
                self.element_done(sink);
                continue;
            }
            let start = pos;
            let Some((l, next)) = line(data, pos, MAX_REPLY_LINE)? else {
                return Ok(pos);
            };
            let Some((&prefix, body)) = l.split_first() else {
                return Err("line too short".into());
            };
            let number = || -> Result<i64, String> {
                std::str::from_utf8(body)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| format!("invalid length: \"{}\"", String::from_utf8_lossy(body)))
            };
            // A pub/sub message's type (element 0) and an unsubscribe's count (element 2)
            // must be a bulk string or an integer.
            let index = self.message_index();
            let kind = self.message.as_ref().and_then(|m| m.kind.clone());
            let unsubscribe = matches!(kind.as_deref(), Some("unsubscribe" | "punsubscribe"));
            let captured = index == Some(0) || (index == Some(2) && unsubscribe);
            if captured && prefix != b'$' && prefix != b':' {
                return Err(format!("unknown prefix: \"{prefix}\""));
            }
            pos = next;
            match prefix {
                b'$' => {
                    let n = number()?;
                    if n < 0 {
                        self.element_done(sink);
                        continue;
                    }
                    let len = n as u64 + 2;
                    if captured && n as usize <= MAX_VALUE_LEN {
                        let n = n as usize;
                        if data.len() - pos < n + 2 {
                            // The whole (short) value is needed: wait for it.
                            return Ok(start);
                        }
                        let value = String::from_utf8_lossy(&data[pos..pos + n]).into_owned();
                        pos += n + 2;
                        if index == Some(0) {
                            if let Some(m) = self.message.as_mut() {
                                m.kind = Some(value);
                            }
                        }
                        self.element_done(sink);
                        continue;
                    }
                    self.skip = len;
                }
                b'*' => {
                    let n = number()?;
                    if n <= 0 {
                        self.element_done(sink);
                        continue;
                    }
                    if self.stack.is_empty() && (n == 3 || n == 4) && sink.in_pub_sub() {
                        self.message = Some(Message {
                            narr: n as u64,
                            ..Message::default()
                        });
                    }
                    self.stack.push(n as u64);
                }
                b':' => {
                    if captured {
                        let v = number()?;
                        if let Some(m) = self.message.as_mut() {
                            if index == Some(0) {
                                m.kind = Some(v.to_string());
                            } else {
                                m.left = v == 0;
                            }
                        }
                    }
                    self.element_done(sink);
                }
                b'+' | b'-' => self.element_done(sink),
                other => return Err(format!("unknown prefix: \"{other}\"")),
            }
        }
    }

    /// An element ended: the arrays it completes end too, and the reply when it is the last.
    fn element_done(&mut self, sink: &mut dyn ReplySink) {
        loop {
            let Some(top) = self.stack.last_mut() else {
                let m = self.message.take();
                sink.reply(Reply {
                    pubsub: m.is_some(),
                    left_pub_sub: m.as_ref().is_some_and(|m| m.left),
                    pubsub_type: m.and_then(|m| m.kind),
                });
                return;
            };
            *top -= 1;
            if *top > 0 {
                return;
            }
            self.stack.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Feeds `data` to a parser in pieces of `step` bytes, as a socket may deliver it;
    /// answers the commands and the bytes consumed in all.
    fn commands(data: &[u8], step: usize, faults: Option<&Faults>) -> (Vec<Command>, usize) {
        let mut p = RequestParser::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut out = Vec::new();
        let mut consumed = 0;
        for piece in data.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                let (used, cmd) = p.parse(&buf, faults).unwrap();
                buf.drain(..used);
                consumed += used;
                match cmd {
                    Some(c) => out.push(c),
                    None => break,
                }
            }
        }
        (out, consumed)
    }

    fn encode(args: &[&str]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            v.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        v
    }

    #[test]
    fn pipelined_commands_in_any_pieces() {
        let mut data = encode(&["SET", "a", "1"]);
        data.extend(encode(&["get", "a"]));
        data.extend(encode(&["PING"]));
        for step in [1, 2, 3, 7, 1000] {
            let (cmds, consumed) = commands(&data, step, None);
            assert_eq!(consumed, data.len(), "step {step}");
            let lines: Vec<Vec<String>> = cmds.iter().map(|c| c.cmd_line.clone()).collect();
            assert_eq!(
                lines,
                vec![
                    vec!["set".to_string(), "a".into(), "1".into()],
                    vec!["get".to_string(), "a".into()],
                    vec!["ping".to_string()],
                ],
                "step {step}"
            );
            assert_eq!(cmds[0].cmd, "set");
        }
    }

    #[test]
    fn long_values_are_recorded_short_and_pass_through() {
        let big = "x".repeat(100_000);
        let data = encode(&["set", "k", &big]);
        for step in [1, 4096, 1 << 20] {
            let (cmds, consumed) = commands(&data, step, None);
            assert_eq!(consumed, data.len());
            assert_eq!(cmds.len(), 1);
            assert_eq!(
                cmds[0].cmd_line[2],
                format!("{}...(100000 bytes)", "x".repeat(MAX_VALUE_LEN))
            );
        }
        // A declared length far past anything sent holds nothing back.
        let mut p = RequestParser::default();
        let head = b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$9000000000\r\n";
        let mut data = head.to_vec();
        data.extend(std::iter::repeat_n(b'y', 4096));
        let (used, cmd) = p.parse(&data, None).unwrap();
        assert_eq!((used, cmd), (data.len(), None));
    }

    #[test]
    fn malformed_commands_are_errors() {
        let err = |d: &[u8]| RequestParser::default().parse(d, None).unwrap_err();
        assert_eq!(err(b"*-1\r\n"), "invalid argument number: -1");
        assert_eq!(err(b"*0\r\n"), "invalid argument number: 0");
        // An inline command: its line is not a length.
        assert_eq!(err(b"PING\r\n"), "invalid len string: \"ING\"");
        assert_eq!(err(b"*1e9\r\n"), "invalid len string: \"1e9\"");
        assert_eq!(err(b"*\r\n"), "line too short");
        assert_eq!(err(b"*1\r\n$-5\r\n"), "invalid bulk length: -5");
        assert_eq!(err(&[b'*'; 200]), "line too long");
        // Incomplete is not an error.
        assert_eq!(
            RequestParser::default()
                .parse(b"*2\r\n$3\r\nge", None)
                .unwrap(),
            (8, None)
        );
    }

    #[test]
    fn faults_pick_a_delay_by_command_and_key() {
        let faults = Faults::compile(Some(&json!({"faults": [
            {"delay": 0.02, "key": "a", "commands": ["get"]},
            {"delay": 0.01, "commands": ["get", "set"]},
            {"delay": 0.06, "key": "b", "commands": ["del"]},
            {"delay": 0.04, "key": "a", "commands": ["mset"]},
            {"delay": 0.02, "key": "b", "commands": ["mset"]},
            {"delay": 0.5, "key": "ignored", "commands": ["Ping"]},
        ]})))
        .unwrap();
        let delay = |args: &[&str]| commands(&encode(args), 5, Some(&faults)).0[0].delay;
        assert_eq!(delay(&["get", "a"]), Some(0.02));
        assert_eq!(delay(&["get", "b"]), Some(0.01));
        assert_eq!(delay(&["set", "a", "a"]), Some(0.01));
        assert_eq!(delay(&["mset", "c", "1", "a", "2", "b", "3"]), Some(0.04));
        assert_eq!(delay(&["mset", "b", "2", "a", "3"]), Some(0.02));
        // "a" is a value here, not a key.
        assert_eq!(delay(&["mset", "c", "a"]), None);
        assert_eq!(delay(&["del", "a", "b"]), Some(0.06));
        // PING has no keys: the rule's key is ignored.
        assert_eq!(delay(&["PING"]), Some(0.5));
        assert_eq!(delay(&["hget", "a", "b"]), None);
    }

    struct Sink {
        pubsub: bool,
        replies: Vec<Reply>,
    }

    impl ReplySink for Sink {
        fn in_pub_sub(&self) -> bool {
            self.pubsub
        }
        fn reply(&mut self, reply: Reply) {
            self.replies.push(reply);
        }
    }

    fn replies(data: &[u8], step: usize, pubsub: bool) -> Vec<Reply> {
        let mut s = ReplyScanner::default();
        let mut sink = Sink {
            pubsub,
            replies: Vec::new(),
        };
        for piece in data.chunks(step) {
            s.feed(piece, &mut sink).unwrap();
        }
        assert!(s.pending.is_empty() && s.stack.is_empty() && s.skip == 0);
        sink.replies
    }

    #[test]
    fn replies_in_any_pieces() {
        let big = "z".repeat(70_000);
        let data = format!(
            "+OK\r\n:5\r\n$-1\r\n$3\r\nbar\r\n-ERR wrong\r\n*2\r\n$1\r\na\r\n*-1\r\n*0\r\n\
             *3\r\n*2\r\n:1\r\n:2\r\n$0\r\n\r\n+x\r\n${}\r\n{big}\r\n",
            big.len()
        );
        for step in [1, 2, 5, 64, 1 << 20] {
            assert_eq!(
                replies(data.as_bytes(), step, false).len(),
                9,
                "step {step}"
            );
        }
    }

    #[test]
    fn pub_sub_messages() {
        let data = b"*3\r\n$9\r\nsubscribe\r\n$3\r\ndog\r\n:1\r\n\
            *3\r\n$7\r\nmessage\r\n$3\r\ndog\r\n$5\r\nHello\r\n\
            *4\r\n$8\r\npmessage\r\n$4\r\ndog*\r\n$4\r\ndog1\r\n$1\r\nx\r\n\
            *3\r\n$11\r\nunsubscribe\r\n$3\r\ndog\r\n:0\r\n";
        for step in [1, 3, 1000] {
            let r = replies(data, step, true);
            let kinds: Vec<_> = r.iter().map(|r| r.pubsub_type.as_deref()).collect();
            assert_eq!(
                kinds,
                vec![
                    Some("subscribe"),
                    Some("message"),
                    Some("pmessage"),
                    Some("unsubscribe")
                ]
            );
            assert!(r.iter().all(|r| r.pubsub));
            assert_eq!(
                r.iter().map(|r| r.left_pub_sub).collect::<Vec<_>>(),
                vec![false, false, false, true]
            );
        }
        // Outside pub/sub mode the same bytes are plain arrays.
        assert!(replies(data, 7, false).iter().all(|r| !r.pubsub));
    }

    #[test]
    fn malformed_replies_are_errors() {
        let mut sink = Sink {
            pubsub: false,
            replies: Vec::new(),
        };
        let err = ReplyScanner::default()
            .feed(b"%1\r\n", &mut sink)
            .unwrap_err();
        assert_eq!(err, "unknown prefix: \"37\"");
        assert!(ReplyScanner::default()
            .feed(b"$abc\r\n", &mut sink)
            .is_err());
        let mut pubsub = Sink {
            pubsub: true,
            replies: Vec::new(),
        };
        assert!(ReplyScanner::default()
            .feed(b"*3\r\n+subscribe\r\n", &mut pubsub)
            .is_err());
    }
}
