//! A GraphQL document parser for the plugins that read queries (degraphql checks its conf's
//! query, graphql-limit-count charges a query by its depth). It accepts the executable
//! documents of the GraphQL specification (operations, fragments, variables, directives,
//! every literal kind) and keeps what those plugins read: each definition's kind and name and
//! the tree of selections. Its error reads as the Lua `graphql` library's APISIX reports,
//! `Syntax error near line N`.

/// Nesting limit, so a hostile query cannot overflow the stack.
const MAX_DEPTH: usize = 128;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    Field {
        name: String,
        selections: Vec<Selection>,
    },
    Spread(String),
    Inline(Vec<Selection>),
}

/// What an operation does (`{ ... }` alone is a query).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationKind {
    Query,
    Mutation,
    Subscription,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Definition {
    Operation {
        kind: OperationKind,
        name: Option<String>,
        selections: Vec<Selection>,
    },
    Fragment {
        name: String,
        selections: Vec<Selection>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    pub definitions: Vec<Definition>,
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Punct(&'static str),
    Name(String),
    Num,
    Str,
}

struct Parser {
    toks: Vec<(Tok, usize)>,
    pos: usize,
    /// The line of the end of the text, for errors at its end.
    last_line: usize,
}

fn lex(text: &str) -> Result<(Vec<(Tok, usize)>, usize), usize> {
    let b = text.as_bytes();
    let (mut i, mut line) = (0, 1);
    let mut toks = Vec::new();
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b' ' | b'\t' | b'\r' | b',' => i += 1,
            0xEF if b[i..].starts_with(&[0xEF, 0xBB, 0xBF]) => i += 3,
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'!' | b'$' | b'(' | b')' | b':' | b'=' | b'@' | b'[' | b']' | b'{' | b'|' | b'}'
            | b'&' => {
                const P: [&str; 13] = [
                    "!", "$", "(", ")", ":", "=", "@", "[", "]", "{", "|", "}", "&",
                ];
                let s = P
                    .iter()
                    .find(|p| p.as_bytes()[0] == c)
                    .copied()
                    .unwrap_or("!");
                toks.push((Tok::Punct(s), line));
                i += 1;
            }
            b'.' if b[i..].starts_with(b"...") => {
                toks.push((Tok::Punct("..."), line));
                i += 3;
            }
            b'"' => {
                let start_line = line;
                if b[i..].starts_with(b"\"\"\"") {
                    i += 3;
                    loop {
                        if i >= b.len() {
                            return Err(line);
                        }
                        if b[i..].starts_with(b"\\\"\"\"") {
                            i += 4;
                        } else if b[i..].starts_with(b"\"\"\"") {
                            i += 3;
                            break;
                        } else {
                            if b[i] == b'\n' {
                                line += 1;
                            }
                            i += 1;
                        }
                    }
                } else {
                    i += 1;
                    loop {
                        match b.get(i) {
                            None | Some(b'\n') => return Err(line),
                            Some(b'\\') => i += 2,
                            Some(b'"') => {
                                i += 1;
                                break;
                            }
                            Some(_) => i += 1,
                        }
                    }
                }
                toks.push((Tok::Str, start_line));
            }
            b'-' | b'0'..=b'9' => {
                i += 1;
                while i < b.len()
                    && (b[i].is_ascii_digit() || matches!(b[i], b'.' | b'e' | b'E' | b'+' | b'-'))
                {
                    i += 1;
                }
                toks.push((Tok::Num, line));
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                let start = i;
                while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
                toks.push((Tok::Name(text[start..i].to_owned()), line));
            }
            _ => return Err(line),
        }
    }
    Ok((toks, line))
}

type Res<T> = Result<T, ()>;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn error_line(&self) -> usize {
        self.toks
            .get(self.pos)
            .map_or(self.last_line, |(_, line)| *line)
    }

    fn is(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn eat(&mut self, p: &str) -> bool {
        if self.is(p) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, p: &str) -> Res<()> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(())
        }
    }

    fn name(&mut self) -> Res<String> {
        match self.peek() {
            Some(Tok::Name(n)) => {
                let n = n.clone();
                self.pos += 1;
                Ok(n)
            }
            _ => Err(()),
        }
    }

    fn peek_name(&self) -> Option<&str> {
        match self.peek() {
            Some(Tok::Name(n)) => Some(n),
            _ => None,
        }
    }

    fn document(&mut self) -> Res<Document> {
        let mut definitions = Vec::new();
        while self.peek().is_some() {
            definitions.push(self.definition()?);
        }
        if definitions.is_empty() {
            return Err(());
        }
        Ok(Document { definitions })
    }

    fn definition(&mut self) -> Res<Definition> {
        if self.is("{") {
            return Ok(Definition::Operation {
                kind: OperationKind::Query,
                name: None,
                selections: self.selection_set(0)?,
            });
        }
        match self.peek_name() {
            Some(word @ ("query" | "mutation" | "subscription")) => {
                let kind = match word {
                    "mutation" => OperationKind::Mutation,
                    "subscription" => OperationKind::Subscription,
                    _ => OperationKind::Query,
                };
                self.pos += 1;
                let name = self
                    .peek_name()
                    .is_some()
                    .then(|| self.name())
                    .transpose()?;
                if self.is("(") {
                    self.variable_definitions()?;
                }
                self.directives()?;
                Ok(Definition::Operation {
                    kind,
                    name,
                    selections: self.selection_set(0)?,
                })
            }
            Some("fragment") => {
                self.pos += 1;
                let name = self.name()?;
                if name == "on" || self.name()? != "on" {
                    return Err(());
                }
                self.name()?;
                self.directives()?;
                Ok(Definition::Fragment {
                    name,
                    selections: self.selection_set(0)?,
                })
            }
            _ => Err(()),
        }
    }

    fn variable_definitions(&mut self) -> Res<()> {
        self.expect("(")?;
        loop {
            self.expect("$")?;
            self.name()?;
            self.expect(":")?;
            self.type_ref(0)?;
            if self.eat("=") {
                self.value(true, 0)?;
            }
            self.directives()?;
            if self.eat(")") {
                return Ok(());
            }
        }
    }

    fn type_ref(&mut self, depth: usize) -> Res<()> {
        if depth > MAX_DEPTH {
            return Err(());
        }
        if self.eat("[") {
            self.type_ref(depth + 1)?;
            self.expect("]")?;
        } else {
            self.name()?;
        }
        self.eat("!");
        Ok(())
    }

    fn directives(&mut self) -> Res<()> {
        while self.eat("@") {
            self.name()?;
            if self.is("(") {
                self.arguments(0)?;
            }
        }
        Ok(())
    }

    fn arguments(&mut self, depth: usize) -> Res<()> {
        self.expect("(")?;
        loop {
            self.name()?;
            self.expect(":")?;
            self.value(false, depth + 1)?;
            if self.eat(")") {
                return Ok(());
            }
        }
    }

    fn value(&mut self, constant: bool, depth: usize) -> Res<()> {
        if depth > MAX_DEPTH {
            return Err(());
        }
        match self.peek() {
            Some(Tok::Punct("$")) if !constant => {
                self.pos += 1;
                self.name()?;
            }
            Some(Tok::Num | Tok::Str | Tok::Name(_)) => self.pos += 1,
            Some(Tok::Punct("[")) => {
                self.pos += 1;
                while !self.eat("]") {
                    self.value(constant, depth + 1)?;
                }
            }
            Some(Tok::Punct("{")) => {
                self.pos += 1;
                while !self.eat("}") {
                    self.name()?;
                    self.expect(":")?;
                    self.value(constant, depth + 1)?;
                }
            }
            _ => return Err(()),
        }
        Ok(())
    }

    fn selection_set(&mut self, depth: usize) -> Res<Vec<Selection>> {
        if depth > MAX_DEPTH {
            return Err(());
        }
        self.expect("{")?;
        let mut out = Vec::new();
        loop {
            out.push(self.selection(depth)?);
            if self.eat("}") {
                return Ok(out);
            }
        }
    }

    fn selection(&mut self, depth: usize) -> Res<Selection> {
        if self.eat("...") {
            match self.peek_name() {
                Some("on") => {
                    self.pos += 1;
                    self.name()?;
                }
                Some(_) => {
                    let name = self.name()?;
                    self.directives()?;
                    return Ok(Selection::Spread(name));
                }
                None => {}
            }
            self.directives()?;
            return Ok(Selection::Inline(self.selection_set(depth + 1)?));
        }
        let mut name = self.name()?;
        if self.eat(":") {
            name = self.name()?;
        }
        if self.is("(") {
            self.arguments(depth)?;
        }
        self.directives()?;
        let selections = if self.is("{") {
            self.selection_set(depth + 1)?
        } else {
            Vec::new()
        };
        Ok(Selection::Field { name, selections })
    }
}

/// Parses `text`; the error is the Lua library's message.
pub fn parse(text: &str) -> Result<Document, String> {
    let fail = |line: usize| format!("Syntax error near line {line}");
    let (toks, last_line) = lex(text).map_err(fail)?;
    let mut p = Parser {
        toks,
        pos: 0,
        last_line,
    };
    p.document().map_err(|()| fail(p.error_line()))
}

/// How deep a selection list nests (a fragment spread counts as the fragment's selections,
/// an inline fragment as its own); `None` when fragment spreads form a cycle.
fn selections_depth(
    list: &[Selection],
    doc: &Document,
    visiting: &mut Vec<String>,
) -> Option<usize> {
    let mut depth = 0;
    for s in list {
        let d = match s {
            Selection::Field { selections, .. } if selections.is_empty() => 0,
            Selection::Field { selections, .. } => 1 + selections_depth(selections, doc, visiting)?,
            Selection::Inline(sel) => selections_depth(sel, doc, visiting)?,
            Selection::Spread(name) => {
                if visiting.contains(name) {
                    return None;
                }
                let frag = doc.definitions.iter().find_map(|d| match d {
                    Definition::Fragment {
                        name: n,
                        selections,
                    } if n == name => Some(selections),
                    _ => None,
                });
                match frag {
                    Some(sel) => {
                        visiting.push(name.clone());
                        let d = selections_depth(sel, doc, visiting);
                        visiting.pop();
                        d?
                    }
                    None => 0,
                }
            }
        };
        depth = depth.max(d);
    }
    Some(depth)
}

/// Whether `text` holds no token at all (only white space, commas and comments): the Lua
/// parser reads it as a document without definitions, which the plugins answer as an empty
/// query rather than a syntax error.
pub fn is_blank(text: &str) -> bool {
    matches!(lex(text), Ok((toks, _)) if toks.is_empty())
}

impl Document {
    /// The operations (not the fragments).
    pub fn operations(&self) -> impl Iterator<Item = (Option<&str>, &[Selection])> {
        self.definitions.iter().filter_map(|d| match d {
            Definition::Operation {
                name, selections, ..
            } => Some((name.as_deref(), &selections[..])),
            Definition::Fragment { .. } => None,
        })
    }

    /// Whether any operation is a mutation.
    pub fn has_mutation(&self) -> bool {
        self.definitions.iter().any(|d| {
            matches!(
                d,
                Definition::Operation {
                    kind: OperationKind::Mutation,
                    ..
                }
            )
        })
    }

    /// The depth of an operation's selections: `{ a { b } }` is 2.
    pub fn depth(&self, selections: &[Selection]) -> Option<usize> {
        selections_depth(selections, self, &mut Vec::new()).map(|d| d + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_measures() {
        let d = parse("{ persons { id name } }").unwrap();
        let (_, sel) = d.operations().next().unwrap();
        assert_eq!(d.depth(sel), Some(2));
        let d = parse(
            "query q($n: [String!]! = [\"a\"]) @x(y: 1) { a(f: {g: $n}) { ...F } }\n\
             fragment F on T { b { ... on U { c } } }",
        )
        .unwrap();
        assert_eq!(d.definitions.len(), 2);
        let (name, sel) = d.operations().next().unwrap();
        assert_eq!(name, Some("q"));
        assert_eq!(d.depth(sel), Some(3));
        let cyc = parse("{ ...A } fragment A on T { x { ...A } }").unwrap();
        let (_, sel) = cyc.operations().next().unwrap();
        assert_eq!(cyc.depth(sel), None);
    }

    #[test]
    fn operations_keep_their_kind() {
        assert!(!parse("{ a }").unwrap().has_mutation());
        assert!(!parse("query q { a } subscription s { b }")
            .unwrap()
            .has_mutation());
        let d = parse("query q { a } mutation m($x: Int) { set(x: $x) { id } }").unwrap();
        assert!(d.has_mutation());
        assert!(matches!(
            d.definitions[1],
            Definition::Operation {
                kind: OperationKind::Mutation,
                ..
            }
        ));
        // A field named `mutation` is not an operation.
        assert!(!parse("{ mutation { a } }").unwrap().has_mutation());
    }

    #[test]
    fn syntax_errors_name_the_line() {
        assert_eq!(parse("uery {}").unwrap_err(), "Syntax error near line 1");
        assert_eq!(
            parse("query {\n a\n b(\n}").unwrap_err(),
            "Syntax error near line 4"
        );
        assert!(parse("").is_err());
        assert!(is_blank(""));
        assert!(is_blank(" ,\n# only a comment\n"));
        assert!(!is_blank("{ a }"));
        assert!(!is_blank("# c\nx"));
        assert!(parse(&"{a".repeat(1000)).is_err());
    }
}
