use super::*;
use serde_json::json;

fn err(input: &str) -> String {
    decode(input.as_bytes()).unwrap_err()
}

#[test]
fn decodes_plain_documents() {
    assert_eq!(
        decode(br#"{"uri":"/a","n":[1,2.5,true,null],"o":{}}"#).unwrap(),
        json!({"uri": "/a", "n": [1, 2.5, true, null], "o": {}})
    );
    assert_eq!(decode(b" \"x\" ").unwrap(), json!("x"));
    assert_eq!(decode(b"1").unwrap(), json!(1));
    assert_eq!(decode(b"[]").unwrap(), json!([]));
}

#[test]
fn keeps_key_order_and_last_duplicate() {
    let v = decode(br#"{"b":1,"a":2,"b":3}"#).unwrap();
    let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["b", "a"]);
    assert_eq!(v["b"], 3);
}

#[test]
fn lua_cjson_error_texts() {
    assert_eq!(
        err("{abcd"),
        "Expected object key string but found invalid token at character 2"
    );
    assert_eq!(
        err("uri=/x"),
        "Expected value but found invalid token at character 1"
    );
    assert_eq!(
        err("{\"a\" 1}"),
        "Expected colon but found T_NUMBER at character 6"
    );
    assert_eq!(
        err("{\"a\":1 \"b\"}"),
        "Expected comma or object end but found T_STRING at character 8"
    );
    assert_eq!(
        err("[1 2]"),
        "Expected comma or array end but found T_NUMBER at character 4"
    );
    assert_eq!(
        err("{\"a\":1}x"),
        "Expected the end but found invalid token at character 8"
    );
    assert_eq!(
        err("{\"a\":1} {"),
        "Expected the end but found T_OBJ_BEGIN at character 9"
    );
    assert_eq!(err("   "), "Expected value but found T_END at character 4");
    assert_eq!(
        err("{"),
        "Expected object key string but found T_END at character 2"
    );
    assert_eq!(
        err("{\"a\":}"),
        "Expected value but found T_OBJ_END at character 6"
    );
    assert_eq!(
        err("[1,]"),
        "Expected value but found T_ARR_END at character 4"
    );
    assert_eq!(
        err("\"abc"),
        "Expected value but found unexpected end of string at character 5"
    );
    assert_eq!(
        err("\"a\\qb\""),
        "Expected value but found invalid escape code at character 3"
    );
    assert_eq!(
        err("\"\\u12\""),
        "Expected value but found invalid unicode escape code at character 2"
    );
    assert_eq!(
        err("\"\\udc00\""),
        "Expected value but found invalid unicode escape code at character 2"
    );
    assert_eq!(
        err("-"),
        "Expected value but found invalid number at character 1"
    );
    assert_eq!(
        err("nope"),
        "Expected value but found invalid token at character 1"
    );
    assert_eq!(
        err("truex"),
        "Expected the end but found invalid token at character 5"
    );
    assert_eq!(
        err("{'a':1}"),
        "Expected object key string but found invalid token at character 2"
    );
    assert_eq!(err("a\0"), "JSON parser does not support UTF-16 or UTF-32");
}

#[test]
fn accepts_what_lua_cjson_accepts() {
    assert_eq!(decode(b"0x10").unwrap(), json!(16));
    assert_eq!(decode(b"+1").unwrap(), json!(1));
    assert_eq!(decode(b"007").unwrap(), json!(7));
    assert_eq!(decode(b"1.0").unwrap(), json!(1));
    assert_eq!(decode(b"1e3").unwrap(), json!(1000));
    assert_eq!(decode(b"-0.5").unwrap(), json!(-0.5));
    // A NUL byte ends the document (the C string stops there).
    assert_eq!(decode(b"{\"a\":1} \0 junk").unwrap(), json!({"a": 1}));
    assert_eq!(
        decode(b"\"\\ud83d\\ude00\\/\"").unwrap(),
        json!("\u{1f600}/")
    );
    assert_eq!(decode(b"\"tab\there\"").unwrap(), json!("tab\there"));
}

#[test]
fn deep_nesting_is_refused_without_recursion() {
    let ok = format!("{}{}", "[".repeat(1000), "]".repeat(1000));
    assert!(decode(ok.as_bytes()).is_ok());
    let deep = "[".repeat(1001);
    assert_eq!(
        decode(deep.as_bytes()).unwrap_err(),
        "Found too many nested data structures (1001) at character 1001"
    );
    let very_deep = "{\"a\":".repeat(200_000);
    assert!(decode(very_deep.as_bytes())
        .unwrap_err()
        .starts_with("Found too many nested data structures (1001)"));
}

/// Issue 8, finding 10: invalid UTF-8 is refused like any bad token, not stored as U+FFFD.
#[test]
fn invalid_utf8_is_refused_where_it_starts() {
    assert_eq!(
        decode(b"{\"uri\":\"/a\xff\"}").unwrap_err(),
        "Expected value but found invalid token at character 11"
    );
    assert_eq!(
        decode(b"{\"u\\n\xc3\x28\":1}").unwrap_err(),
        "Expected object key string but found invalid token at character 6"
    );
    // Valid multi-byte text is kept.
    assert_eq!(decode("\"é€😀\"".as_bytes()).unwrap(), json!("é€😀"));
}
