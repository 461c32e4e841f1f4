//! lua-resty-template's syntax as body-transformer uses it: `{{expr}}` writes the value
//! HTML-escaped (`& < > " ' /`; nil as nothing), `{*expr*}` writes it as it is, `{% code %}`
//! runs Lua (a newline right after `%}` is dropped), `{# comment #}` is left out and
//! `{-raw-}...{-raw-}` is written untouched. The template becomes one Lua chunk whose text and
//! expressions are calls of the writers below, run by [`super::lua`].

use super::lua::{self, Expr, Globals, Machine, Stat};

/// What a compiled template writes and runs.
#[derive(Debug)]
pub struct Template {
    chunk: Vec<Stat>,
    texts: Vec<String>,
    /// The `_ctx.var.<name>` the template reads, captured before it runs.
    pub vars: Vec<String>,
}

const TEXT: &str = "___text";
const ESCAPED: &str = "___escaped";
const RAW: &str = "___raw";

/// Compiles `text`; the error is the Lua parser's.
pub fn compile(text: &str) -> Result<Template, String> {
    let mut src = String::new();
    let mut texts = Vec::new();
    let mut rest = text;
    let push_text = |src: &mut String, t: &str, texts: &mut Vec<String>| {
        if !t.is_empty() {
            src.push_str(&format!(" {TEXT}({}) ", texts.len()));
            texts.push(t.to_owned());
        }
    };
    loop {
        let next = ["{{", "{*", "{%", "{#", "{-raw-}"]
            .iter()
            .filter_map(|m| rest.find(m).map(|i| (i, *m)))
            .min_by_key(|(i, _)| *i);
        let Some((i, open)) = next else {
            push_text(&mut src, rest, &mut texts);
            break;
        };
        push_text(&mut src, &rest[..i], &mut texts);
        let after = &rest[i + open.len()..];
        let close = match open {
            "{{" => "}}",
            "{*" => "*}",
            "{%" => "%}",
            "{#" => "#}",
            _ => "{-raw-}",
        };
        let Some(end) = after.find(close) else {
            // No end: the rest is text, as lua-resty-template leaves it.
            push_text(&mut src, &rest[i..], &mut texts);
            break;
        };
        let inner = &after[..end];
        rest = &after[end + close.len()..];
        match open {
            "{{" => src.push_str(&format!(" {ESCAPED}(({inner})) ")),
            "{*" => src.push_str(&format!(" {RAW}(({inner})) ")),
            "{%" => {
                src.push('\n');
                src.push_str(inner);
                src.push('\n');
                rest = rest
                    .strip_prefix("\r\n")
                    .or_else(|| rest.strip_prefix('\n'))
                    .unwrap_or(rest);
            }
            "{#" => {}
            _ => push_text(&mut src, inner, &mut texts),
        }
    }
    let chunk = lua::parse_chunk(&src)?;
    let mut vars = Vec::new();
    for s in &chunk {
        stat_vars(s, &mut vars);
    }
    Ok(Template { chunk, texts, vars })
}

fn expr_vars(e: &Expr, out: &mut Vec<String>) {
    match e {
        Expr::Index(obj, key) => {
            if let (Expr::Index(ctx, var), Expr::Str(name)) = (&**obj, &**key) {
                if matches!((&**ctx, &**var), (Expr::Name(c), Expr::Str(v)) if c == "_ctx" && v == "var")
                    && !out.contains(name)
                {
                    out.push(name.clone());
                }
            }
            expr_vars(obj, out);
            expr_vars(key, out);
        }
        Expr::Call(f, args) => {
            expr_vars(f, out);
            args.iter().for_each(|a| expr_vars(a, out));
        }
        Expr::Method(o, _, args) => {
            expr_vars(o, out);
            args.iter().for_each(|a| expr_vars(a, out));
        }
        Expr::Bin(_, l, r) => {
            expr_vars(l, out);
            expr_vars(r, out);
        }
        Expr::Un(_, x) => expr_vars(x, out),
        Expr::Table(items) => {
            for (k, v) in items {
                if let Some(k) = k {
                    expr_vars(k, out);
                }
                expr_vars(v, out);
            }
        }
        _ => {}
    }
}

fn stat_vars(s: &Stat, out: &mut Vec<String>) {
    let block = |b: &[Stat], out: &mut Vec<String>| b.iter().for_each(|s| stat_vars(s, out));
    match s {
        Stat::Local(_, es) => es.iter().for_each(|e| expr_vars(e, out)),
        Stat::Assign(ts, es) => ts.iter().chain(es).for_each(|e| expr_vars(e, out)),
        Stat::Call(e) => expr_vars(e, out),
        Stat::If(arms, otherwise) => {
            for (c, b) in arms {
                expr_vars(c, out);
                block(b, out);
            }
            if let Some(b) = otherwise {
                block(b, out);
            }
        }
        Stat::NumFor(_, a, b, c, body) => {
            expr_vars(a, out);
            expr_vars(b, out);
            if let Some(c) = c {
                expr_vars(c, out);
            }
            block(body, out);
        }
        Stat::GenFor(_, es, body) => {
            es.iter().for_each(|e| expr_vars(e, out));
            block(body, out);
        }
        Stat::While(c, body) => {
            expr_vars(c, out);
            block(body, out);
        }
        Stat::Do(body) => block(body, out),
        Stat::Break | Stat::Return => {}
    }
}

impl Template {
    /// Runs the template with `globals` (the decoded body and the helpers); the output is
    /// bounded by `max_out` bytes.
    pub fn render(
        &self,
        globals: &dyn Globals,
        setup: impl FnOnce(&mut Machine<'_>),
        max_out: usize,
    ) -> Result<String, String> {
        let mut m = Machine::new(globals, max_out);
        setup(&mut m);
        m.set_texts(&self.texts, TEXT, ESCAPED, RAW);
        m.run(&self.chunk)?;
        Ok(std::mem::take(&mut m.out))
    }
}

#[cfg(test)]
mod tests {
    use super::super::lua::Val;
    use super::*;

    struct G;

    impl Globals for G {
        fn global(&self, name: &str) -> Val {
            match name {
                "name" => Val::str("a/b&c"),
                "n" => Val::Num(20.0),
                _ => Val::Nil,
            }
        }
    }

    fn render(t: &str) -> Result<String, String> {
        compile(t)?.render(&G, |_| {}, 1 << 20)
    }

    #[test]
    fn syntax() {
        assert_eq!(
            render("<{{name}}>{*name*}").unwrap(),
            "<a&#47;b&amp;c>a/b&c"
        );
        assert_eq!(render("{\"n\":{{n+10}}}").unwrap(), "{\"n\":30}");
        assert_eq!(
            render("{% if n > 1 then %}\nbig{% else %}small{% end %}").unwrap(),
            "big"
        );
        assert_eq!(
            render("{# note #}{-raw-}{{x}}{-raw-}{{missing}}.").unwrap(),
            "{{x}}."
        );
        assert_eq!(
            render("{% for i = 1, 3 do %}{{i}},{% end %}").unwrap(),
            "1,2,3,"
        );
        assert!(compile("{% if x then %}").is_err());
        assert_eq!(
            compile("{{_ctx.var.arg_id}}{% if _ctx.var.status == 200 then end %}")
                .unwrap()
                .vars,
            vec!["arg_id", "status"]
        );
    }

    /// The modules APISIX's documented templates require.
    #[test]
    fn required_modules() {
        assert_eq!(
            render(
                "{% local yaml = require(\"tinyyaml\") local body = yaml.parse(\"foobar:\\n  foo: hello\\n  bar: world\") %}\
                 {\"foobar\":\"{{body.foobar.foo .. \" \" .. body.foobar.bar}}\"}"
            )
            .unwrap(),
            "{\"foobar\":\"hello world\"}"
        );
        assert_eq!(
            render("{% local y = require(\"lyaml\") %}{{y.load(\"a: [1, 2]\").a[2]}}").unwrap(),
            "2"
        );
        assert_eq!(
            render(
                "{% local cjson = require 'cjson' local t = cjson.decode('{\"a\":[1,\"x\"]}') %}\
                 {* cjson.encode({n = t.a[1] + 1, s = t.a[2]}) *}"
            )
            .unwrap(),
            "{\"n\":2,\"s\":\"x\"}"
        );
        assert_eq!(
            render(
                "{% local core = require 'apisix.core' local v, err = core.json.decode('{') %}\
                 {{v == nil}} {{err ~= nil}} {* core.json.encode({1, 2}) *}"
            )
            .unwrap(),
            "true true [1,2]"
        );
        assert_eq!(
            render("{% local s = require 'cjson.safe' %}{{s.decode('[true]')[1]}}").unwrap(),
            "true"
        );
        // cjson's decode fails the render on bad JSON, as does a module that is not there.
        assert!(
            render("{% local c = require 'cjson' %}{{c.decode('nope')}}")
                .unwrap_err()
                .contains("Expected value")
        );
        assert!(render("{% local m = require 'resty.http' %}")
            .unwrap_err()
            .contains("module 'resty.http' not found"));
    }
}
