//! The part of Casbin authz-casbin needs: a model (`[request_definition]`,
//! `[policy_definition]`, `[role_definition]`, `[policy_effect]`, `[matchers]`) and a CSV
//! policy (`p, ...` and `g, ...` lines) compiled into an enforcer whose `enforce(sub, obj,
//! act)` evaluates the matcher against each policy line and combines the results by the
//! effect.
//!
//! Matchers are expressions over `r.<field>`, `p.<field>`, string literals, `==`, `!=`, `!`,
//! `&&`, `||`, parentheses and the functions `keyMatch`, `keyMatch2`, `keyMatch3`,
//! `regexMatch`, `ipMatch`, `globMatch` and each role definition (`g(a, b)`, `g(a, b, dom)`;
//! roles inherit transitively). Effects: `some(where (p.eft == allow))`,
//! `!some(where (p.eft == deny))`, both joined with `&&`, and `priority(p.eft) || deny`.
//! Anything else is refused when the model is compiled.

use std::collections::{HashMap, HashSet};

/// How matched policies decide.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Effect {
    AllowOverride,
    DenyOverride,
    AllowAndDeny,
    Priority,
}

#[derive(Clone, Debug, PartialEq)]
enum Expr {
    Str(String),
    Bool(bool),
    /// `r.<i>` or `p.<i>`.
    Request(usize),
    Policy(usize),
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Eq(Box<Expr>, Box<Expr>),
    Ne(Box<Expr>, Box<Expr>),
    Call(String, Vec<Expr>),
}

/// A compiled model and policy.
#[derive(Debug)]
pub struct Enforcer {
    request_fields: Vec<String>,
    matcher: Expr,
    effect: Effect,
    /// The index of `eft` among the policy fields, if the policy has one.
    eft: Option<usize>,
    policies: Vec<Vec<String>>,
    /// Role links per role definition: (domain or "", user) -> roles.
    roles: HashMap<String, HashMap<(String, String), Vec<String>>>,
    regexes: HashMap<String, regex::Regex>,
}

fn sections(text: &str) -> HashMap<String, Vec<(String, String)>> {
    let mut out: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let mut current = String::new();
    let mut last_key: Option<(String, String)> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') && line.ends_with(']') {
            current = line[1..line.len() - 1].trim().to_owned();
            last_key = None;
            continue;
        }
        // A line ending in `\` continues on the next.
        if let Some((sec, key)) = &last_key {
            if let Some(entry) = out
                .get_mut(sec)
                .and_then(|v| v.iter_mut().find(|(k, _)| k == key))
            {
                if entry.1.ends_with('\\') {
                    entry.1.pop();
                    entry.1.push_str(line);
                    continue;
                }
            }
        }
        if let Some((k, v)) = line.split_once('=') {
            let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
            out.entry(current.clone()).or_default().push((k.clone(), v));
            last_key = Some((current.clone(), k));
        }
    }
    out
}

fn fields(def: &str) -> Vec<String> {
    def.split(',').map(|f| f.trim().to_owned()).collect()
}

fn parse_effect(text: &str) -> Result<Effect, String> {
    let norm: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    match norm.as_str() {
        "some(where(p.eft==allow))" => Ok(Effect::AllowOverride),
        "!some(where(p.eft==deny))" => Ok(Effect::DenyOverride),
        "some(where(p.eft==allow))&&!some(where(p.eft==deny))" => Ok(Effect::AllowAndDeny),
        "priority(p.eft)||deny" => Ok(Effect::Priority),
        _ => Err(format!("unsupported policy effect: {text}")),
    }
}

/// One CSV line of a policy (fields trimmed, quotes removed).
fn csv(line: &str) -> Vec<String> {
    line.split(',')
        .map(|f| f.trim().trim_matches('"').to_owned())
        .collect()
}

impl Enforcer {
    pub fn new(model: &str, policy: &str) -> Result<Enforcer, String> {
        let s = sections(model);
        let one = |sec: &str, key: &str| {
            s.get(sec)
                .and_then(|v| v.iter().find(|(k, _)| k == key))
                .map(|(_, v)| v.clone())
                .ok_or_else(|| format!("missing {key} in [{sec}]"))
        };
        let request_fields = fields(&one("request_definition", "r")?);
        let policy_fields = fields(&one("policy_definition", "p")?);
        let effect = parse_effect(&one("policy_effect", "e")?)?;
        let role_defs: Vec<String> = s
            .get("role_definition")
            .map(|v| v.iter().map(|(k, _)| k.clone()).collect())
            .unwrap_or_default();
        let mut parser = Parser {
            src: one("matchers", "m")?.chars().collect(),
            pos: 0,
            request: &request_fields,
            policy: &policy_fields,
            roles: &role_defs,
        };
        let matcher = parser.expr()?;
        parser.skip_ws();
        if parser.pos != parser.src.len() {
            return Err(format!("unexpected text in matcher at {}", parser.pos));
        }
        let mut policies = Vec::new();
        let mut roles: HashMap<String, HashMap<(String, String), Vec<String>>> = HashMap::new();
        for line in policy.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut f = csv(line);
            let kind = f.remove(0);
            if kind == "p" {
                f.resize(policy_fields.len(), String::new());
                policies.push(f);
            } else if role_defs.contains(&kind) && f.len() >= 2 {
                let domain = f.get(2).cloned().unwrap_or_default();
                roles
                    .entry(kind)
                    .or_default()
                    .entry((domain, f[0].clone()))
                    .or_default()
                    .push(f[1].clone());
            }
        }
        let mut regexes = HashMap::new();
        collect_regexes(&matcher, &policies, &mut regexes);
        Ok(Enforcer {
            request_fields,
            eft: policy_fields.iter().position(|f| f == "eft"),
            matcher,
            effect,
            policies,
            roles,
            regexes,
        })
    }

    /// Whether the request (`values` in `request_definition` order) is allowed.
    pub fn enforce(&self, values: &[&str]) -> bool {
        if values.len() != self.request_fields.len() {
            return false;
        }
        let mut some_allow = false;
        let mut some_deny = false;
        for p in &self.policies {
            if !truthy(&self.eval(&self.matcher, values, p)) {
                continue;
            }
            let allow = self.eft.is_none_or(|i| p[i] != "deny");
            if self.effect == Effect::Priority {
                return allow;
            }
            if allow {
                some_allow = true;
            } else {
                some_deny = true;
            }
        }
        match self.effect {
            Effect::AllowOverride => some_allow,
            Effect::DenyOverride => !some_deny,
            Effect::AllowAndDeny => some_allow && !some_deny,
            Effect::Priority => false,
        }
    }

    fn has_role(&self, def: &str, user: &str, role: &str, domain: &str) -> bool {
        if user == role {
            return true;
        }
        let Some(links) = self.roles.get(def) else {
            return false;
        };
        let mut seen = HashSet::new();
        let mut todo = vec![(user.to_owned(), 0)];
        while let Some((u, depth)) = todo.pop() {
            // Casbin's default role manager stops at ten levels.
            if depth >= 10 || !seen.insert(u.clone()) {
                continue;
            }
            for r in links.get(&(domain.to_owned(), u)).into_iter().flatten() {
                if r == role {
                    return true;
                }
                todo.push((r.clone(), depth + 1));
            }
        }
        false
    }

    fn eval(&self, e: &Expr, r: &[&str], p: &[String]) -> Value {
        match e {
            Expr::Str(s) => Value::Str(s.clone()),
            Expr::Bool(b) => Value::Bool(*b),
            Expr::Request(i) => Value::Str(r[*i].to_owned()),
            Expr::Policy(i) => Value::Str(p[*i].clone()),
            Expr::Not(x) => Value::Bool(!truthy(&self.eval(x, r, p))),
            Expr::And(a, b) => {
                Value::Bool(truthy(&self.eval(a, r, p)) && truthy(&self.eval(b, r, p)))
            }
            Expr::Or(a, b) => {
                Value::Bool(truthy(&self.eval(a, r, p)) || truthy(&self.eval(b, r, p)))
            }
            Expr::Eq(a, b) => Value::Bool(self.eval(a, r, p) == self.eval(b, r, p)),
            Expr::Ne(a, b) => Value::Bool(self.eval(a, r, p) != self.eval(b, r, p)),
            Expr::Call(name, args) => {
                let args: Vec<String> = args
                    .iter()
                    .map(|a| match self.eval(a, r, p) {
                        Value::Str(s) => s,
                        Value::Bool(b) => b.to_string(),
                    })
                    .collect();
                let a = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
                Value::Bool(match name.as_str() {
                    "keyMatch" => key_match(a(0), a(1)),
                    "keyMatch2" => self.pattern_match(a(0), &key_match2_pattern(a(1))),
                    "keyMatch3" => self.pattern_match(a(0), &key_match3_pattern(a(1))),
                    "regexMatch" => self.regex_find(a(0), a(1)),
                    "globMatch" => self.pattern_match(a(0), &glob_pattern(a(1))),
                    "ipMatch" => ip_match(a(0), a(1)),
                    role => self.has_role(role, a(0), a(1), a(2)),
                })
            }
        }
    }

    fn regex(&self, pattern: &str) -> Option<regex::Regex> {
        match self.regexes.get(pattern) {
            Some(r) => Some(r.clone()),
            None => regex::Regex::new(pattern).ok(),
        }
    }

    fn pattern_match(&self, key: &str, pattern: &str) -> bool {
        self.regex(pattern).is_some_and(|r| r.is_match(key))
    }

    fn regex_find(&self, key: &str, pattern: &str) -> bool {
        self.regex(pattern).is_some_and(|r| r.is_match(key))
    }
}

/// The regexes the policy lines feed to the matcher's functions, compiled once.
fn collect_regexes(e: &Expr, policies: &[Vec<String>], out: &mut HashMap<String, regex::Regex>) {
    match e {
        Expr::Not(x) => collect_regexes(x, policies, out),
        Expr::And(a, b) | Expr::Or(a, b) | Expr::Eq(a, b) | Expr::Ne(a, b) => {
            collect_regexes(a, policies, out);
            collect_regexes(b, policies, out);
        }
        Expr::Call(name, args) => {
            let make: Option<fn(&str) -> String> = match name.as_str() {
                "keyMatch2" => Some(key_match2_pattern),
                "keyMatch3" => Some(key_match3_pattern),
                "regexMatch" => Some(str::to_owned),
                "globMatch" => Some(glob_pattern),
                _ => None,
            };
            if let (Some(make), Some(Expr::Policy(i))) = (make, args.get(1)) {
                for p in policies {
                    let pattern = make(&p[*i]);
                    if let Ok(r) = regex::Regex::new(&pattern) {
                        out.insert(pattern, r);
                    }
                }
            }
            for a in args {
                collect_regexes(a, policies, out);
            }
        }
        _ => {}
    }
}

/// Casbin's `keyMatch`: `key2` may end its literal part with `*`, matching any rest.
pub fn key_match(key1: &str, key2: &str) -> bool {
    match key2.find('*') {
        None => key1 == key2,
        Some(i) => key1.len() >= i && key1.as_bytes()[..i] == key2.as_bytes()[..i],
    }
}

fn key_match2_pattern(key2: &str) -> String {
    let star = key2.replace("/*", "/.*");
    let re = regex::Regex::new(r":[^/]+").expect("a valid regex");
    format!("^{}$", re.replace_all(&star, "[^/]+"))
}

fn key_match3_pattern(key2: &str) -> String {
    let star = key2.replace("/*", "/.*");
    let re = regex::Regex::new(r"\{[^/]+?\}").expect("a valid regex");
    format!("^{}$", re.replace_all(&star, "[^/]+"))
}

fn glob_pattern(glob: &str) -> String {
    let mut out = String::from("^");
    for c in glob.chars() {
        match c {
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            c => out.push_str(&regex::escape(&c.to_string())),
        }
    }
    out.push('$');
    out
}

fn ip_match(ip: &str, pattern: &str) -> bool {
    let Ok(addr) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    if let Ok(net) = pattern.parse::<ipnet::IpNet>() {
        return net.contains(&addr);
    }
    pattern.parse::<std::net::IpAddr>() == Ok(addr)
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    Bool(bool),
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::Str(s) => !s.is_empty(),
    }
}

/// The matcher's recursive descent parser.
struct Parser<'a> {
    src: Vec<char>,
    pos: usize,
    request: &'a [String],
    policy: &'a [String],
    roles: &'a [String],
}

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while self.src.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_ws();
        let t: Vec<char> = token.chars().collect();
        if self.src[self.pos..].starts_with(&t) {
            self.pos += t.len();
            true
        } else {
            false
        }
    }

    fn expr(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.eat("||") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.compare()?;
        while self.eat("&&") {
            left = Expr::And(Box::new(left), Box::new(self.compare()?));
        }
        Ok(left)
    }

    fn compare(&mut self) -> Result<Expr, String> {
        let left = self.unary()?;
        if self.eat("==") {
            return Ok(Expr::Eq(Box::new(left), Box::new(self.unary()?)));
        }
        if self.eat("!=") {
            return Ok(Expr::Ne(Box::new(left), Box::new(self.unary()?)));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, String> {
        self.skip_ws();
        if self.eat("(") {
            let e = self.expr()?;
            if !self.eat(")") {
                return Err("missing ) in matcher".into());
            }
            return Ok(e);
        }
        match self.src.get(self.pos) {
            Some(&q) if q == '"' || q == '\'' => {
                let start = self.pos + 1;
                let end = self.src[start..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or("unterminated string in matcher")?;
                self.pos = start + end + 1;
                return Ok(Expr::Str(self.src[start..start + end].iter().collect()));
            }
            _ => {}
        }
        let start = self.pos;
        while self
            .src
            .get(self.pos)
            .is_some_and(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
        {
            self.pos += 1;
        }
        let ident: String = self.src[start..self.pos].iter().collect();
        if ident.is_empty() {
            return Err(format!("unexpected text in matcher at {start}"));
        }
        if self.eat("(") {
            let mut args = Vec::new();
            if !self.eat(")") {
                loop {
                    args.push(self.expr()?);
                    if self.eat(")") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err("missing , or ) in matcher".into());
                    }
                }
            }
            let known = [
                "keyMatch",
                "keyMatch2",
                "keyMatch3",
                "regexMatch",
                "globMatch",
                "ipMatch",
            ];
            if !known.contains(&ident.as_str()) && !self.roles.contains(&ident) {
                return Err(format!("unknown function {ident} in matcher"));
            }
            return Ok(Expr::Call(ident, args));
        }
        match ident.as_str() {
            "true" => return Ok(Expr::Bool(true)),
            "false" => return Ok(Expr::Bool(false)),
            _ => {}
        }
        if let Some(f) = ident.strip_prefix("r.") {
            let i = self
                .request
                .iter()
                .position(|x| x == f)
                .ok_or_else(|| format!("unknown request field {f}"))?;
            return Ok(Expr::Request(i));
        }
        if let Some(f) = ident.strip_prefix("p.") {
            let i = self
                .policy
                .iter()
                .position(|x| x == f)
                .ok_or_else(|| format!("unknown policy field {f}"))?;
            return Ok(Expr::Policy(i));
        }
        Err(format!("unknown name {ident} in matcher"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "[request_definition]\nr = sub, obj, act\n\n[policy_definition]\np = sub, obj, act\n\n[role_definition]\ng = _, _\n\n[policy_effect]\ne = some(where (p.eft == allow))\n\n[matchers]\nm = (g(r.sub, p.sub) || keyMatch(r.sub, p.sub)) && keyMatch(r.obj, p.obj) && keyMatch(r.act, p.act)";

    #[test]
    fn apisix_test_model() {
        let e = Enforcer::new(
            MODEL,
            "p, *, /, GET\np, admin, *, *\ng, alice, admin\ng, bob, alice",
        )
        .unwrap();
        assert!(e.enforce(&["anonymous", "/", "GET"]));
        assert!(!e.enforce(&["anonymous", "/", "POST"]));
        assert!(!e.enforce(&["anonymous", "/res", "GET"]));
        assert!(e.enforce(&["admin", "/res", "DELETE"]));
        assert!(e.enforce(&["alice", "/res", "PUT"]));
        assert!(e.enforce(&["bob", "/x", "PUT"]), "roles inherit");
        assert!(!e.enforce(&["eve", "/x", "PUT"]));
    }

    #[test]
    fn effects_and_functions() {
        let model = "[request_definition]\nr = sub, obj, act\n[policy_definition]\np = sub, obj, act, eft\n[policy_effect]\ne = some(where (p.eft == allow)) && !some(where (p.eft == deny))\n[matchers]\nm = r.sub == p.sub && keyMatch2(r.obj, p.obj) && regexMatch(r.act, p.act)";
        let e =
            Enforcer::new(model, "p, a, /u/:id, GET|PUT, allow\np, a, /u/0, PUT, deny").unwrap();
        assert!(e.enforce(&["a", "/u/7", "GET"]));
        assert!(e.enforce(&["a", "/u/0", "GET"]));
        assert!(!e.enforce(&["a", "/u/0", "PUT"]));
        assert!(!e.enforce(&["b", "/u/7", "GET"]));
        assert!(!e.enforce(&["a", "/u/7/x", "GET"]));
        assert!(key_match("/foo/bar", "/foo/*") && !key_match("/fo", "/foo/*"));
        assert!(Enforcer::new(&model.replace("keyMatch2", "evil"), "").is_err());
        assert!(Enforcer::new(&model.replace("e = some", "e = any"), "").is_err());
    }
}
