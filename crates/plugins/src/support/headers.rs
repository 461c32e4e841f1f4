//! Header values with `$var` templates, as proxy-rewrite and response-rewrite configure them
//! (`core.utils.resolve_var`), and the checks APISIX makes of header fields and values.

use std::borrow::Cow;

use ferrisix_config::schema::lua;
use ferrisix_plugin_api::Template;
use ferrisix_router::VarSource;
use http::{HeaderName, HeaderValue};
use serde_json::Value;

/// A header value as a conf gives it: a string (a template) or a number.
pub fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(lua::json_number(n)),
        _ => None,
    }
}

/// `core.utils.validate_header_field`: printable ASCII without `:`.
pub fn valid_field(field: &str) -> bool {
    field.bytes().all(|b| b > 32 && b < 127 && b != b':')
}

/// `core.utils.validate_header_value`: no control or non-ASCII bytes.
pub fn valid_value(value: &str) -> bool {
    value.bytes().all(|b| (32..127).contains(&b))
}

/// A header name from a conf; `None` (with a warning) for one nginx could not send.
pub fn name(field: &str, plugin: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(field.as_bytes()) {
        Ok(n) => Some(n),
        Err(_) => {
            tracing::warn!(plugin, field, "header name nginx cannot send; left out");
            None
        }
    }
}

/// A value to send; `None` (with a warning) for one with bytes a header may not carry (what
/// `ngx.req.set_header` refuses as unsafe).
pub fn header_value(text: &str, plugin: &str, field: &HeaderName) -> Option<HeaderValue> {
    match HeaderValue::from_str(text) {
        Ok(v) => Some(v),
        Err(_) => {
            tracing::warn!(plugin, header = %field, "resolved header value is not a valid header value; not set");
            None
        }
    }
}

/// One configured value: literal (made once) or a template resolved per request.
#[derive(Clone, Debug)]
pub enum ValueTemplate {
    Literal(Option<HeaderValue>, String),
    Vars(Template),
}

impl ValueTemplate {
    pub fn new(text: &str) -> ValueTemplate {
        let t = Template::parse(text);
        match t.literal() {
            Some(lit) => ValueTemplate::Literal(HeaderValue::from_str(lit).ok(), lit.to_owned()),
            None => ValueTemplate::Vars(t),
        }
    }

    /// The text of the value for this request.
    pub fn resolve<'a>(&'a self, vars: &dyn VarSource) -> Cow<'a, str> {
        match self {
            ValueTemplate::Literal(_, s) => Cow::Borrowed(s),
            ValueTemplate::Vars(t) => Cow::Owned(t.resolve(vars).text),
        }
    }

    /// The value for this request, ready to send (`None`: not a valid header value).
    pub fn header_value(
        &self,
        vars: &dyn VarSource,
        plugin: &str,
        field: &HeaderName,
    ) -> Option<HeaderValue> {
        match self {
            ValueTemplate::Literal(Some(v), _) => Some(v.clone()),
            ValueTemplate::Literal(None, s) => header_value(s, plugin, field),
            ValueTemplate::Vars(t) => header_value(&t.resolve(vars).text, plugin, field),
        }
    }

    /// The value is a fixed, empty text.
    pub fn is_empty_literal(&self) -> bool {
        matches!(self, ValueTemplate::Literal(_, s) if s.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_values_and_templates() {
        assert!(valid_field("X-Api-Version"));
        assert!(!valid_field("X Api") && !valid_field("a:b") && !valid_field("é"));
        assert!(valid_value("v 1") && !valid_value("a\r\nb"));
        assert_eq!(value_text(&json!(1.5)).as_deref(), Some("1.5"));
        assert_eq!(value_text(&json!(10)).as_deref(), Some("10"));
        assert_eq!(value_text(&json!(true)), None);
        let t = ValueTemplate::new("lit");
        let name = HeaderName::from_static("x");
        assert_eq!(t.header_value(&(), "p", &name).unwrap(), "lit");
        let t = ValueTemplate::new("a-$nope");
        assert_eq!(t.resolve(&()), "a-");
        assert!(ValueTemplate::new("").is_empty_literal());
    }
}
