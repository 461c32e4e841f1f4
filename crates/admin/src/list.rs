//! `GET /apisix/admin/<resource>`: the v3 list envelope, its filters and paging, in APISIX's
//! order (filter, then `total`, then the page).

use ferrisix_config::schema::{lua, pattern_search};
use serde_json::{json, Map, Value};

use crate::args::{decode_args, Arg, Args};

/// One listed key.
#[derive(Clone, Debug)]
pub struct Item {
    pub key: String,
    pub value: Value,
    pub create_revision: i64,
    pub mod_revision: i64,
}

/// The answer to a list request.
pub enum ListAnswer {
    Json(Value),
    /// `page_size` out of range: a plain-text 400.
    BadPageSize,
}

/// Filters, counts and pages `items` (already in key order) per the query `args`.
pub fn answer(mut items: Vec<Item>, args: &Args, filter_fields: &[&str]) -> ListAnswer {
    items.retain(|item| keep(item, args, filter_fields));
    let total = items.len();

    let page = args.get("page").and_then(arg_number);
    let page_size = args.get("page_size").and_then(arg_number);
    let list = match (page, page_size) {
        (Some(page), Some(size)) => {
            if !(10.0..=500.0).contains(&size) {
                return ListAnswer::BadPageSize;
            }
            let page = if page < 1.0 { 1.0 } else { page };
            items.sort_by_key(|i| i.create_revision);
            let to = page * size;
            let from = to - size + 1.0;
            // Lua's `for i = from, to`: only whole indices hit the array.
            // `size` is at most 500, so this loop is bounded whatever `page` is.
            let mut out = Vec::new();
            let mut k = 0.0;
            while k <= size {
                let i = from + k;
                if i > to || i > items.len() as f64 {
                    break;
                }
                if i.fract() == 0.0 && i >= 1.0 {
                    out.push(envelope(&items[i as usize - 1]));
                }
                k += 1.0;
            }
            if out.is_empty() {
                // A fresh Lua table with nothing in it is encoded as an object.
                Value::Object(Map::new())
            } else {
                Value::Array(out)
            }
        }
        _ => Value::Array(items.iter().map(envelope).collect()),
    };
    ListAnswer::Json(json!({"list": list, "total": total}))
}

/// The page a list request asks for as `(offset, limit)`, when the store can serve it on its
/// own: no filter (a filter needs every item), `page` and a valid `page_size` both whole
/// numbers. Anything else goes through [`answer`] with the whole directory.
pub fn store_page(args: &Args) -> Option<(usize, usize)> {
    if ["name", "label", "uri", "filter"]
        .iter()
        .any(|f| args.get(f).is_some())
    {
        return None;
    }
    let page = args.get("page").and_then(arg_number)?;
    let size = args.get("page_size").and_then(arg_number)?;
    if !(10.0..=500.0).contains(&size) || size.fract() != 0.0 || page.fract() != 0.0 {
        return None;
    }
    let page = if page < 1.0 { 1.0 } else { page };
    // Saturating: a page past any directory is an empty one.
    Some((((page - 1.0) * size) as usize, size as usize))
}

/// The answer to a list request the store paged ([`store_page`]): `items` is the page, in
/// order; `total` counts the whole directory.
pub fn paged_answer(items: &[Item], total: usize) -> Value {
    let list = if items.is_empty() {
        // A fresh Lua table with nothing in it is encoded as an object.
        Value::Object(Map::new())
    } else {
        Value::Array(items.iter().map(envelope).collect())
    };
    json!({"list": list, "total": total})
}

/// `{key, value, createdIndex, modifiedIndex}` for one item.
pub fn envelope(item: &Item) -> Value {
    json!({
        "key": item.key,
        "value": crate::response::lua_view(item.value.clone()),
        "createdIndex": item.create_revision,
        "modifiedIndex": item.mod_revision,
    })
}

fn arg_number(arg: &Arg) -> Option<f64> {
    arg.as_str().and_then(lua::tonumber)
}

/// `tostring` of a field, as `ngx.re.find` sees its subject.
fn subject(v: Option<&Value>) -> String {
    match v {
        None => "nil".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => lua::json_number(n),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Null) => "userdata: NULL".to_string(),
        Some(_) => "table".to_string(),
    }
}

fn keep(item: &Item, args: &Args, filter_fields: &[&str]) -> bool {
    let value = &item.value;
    if let Some(arg) = args.get("name") {
        let Some(pattern) = arg.as_str() else {
            return false;
        };
        if !pattern_search(pattern, &subject(value.get("name"))) {
            return false;
        }
    }
    if let Some(arg) = args.get("label") {
        let Some(label) = arg.as_str() else {
            return false;
        };
        let has = value
            .get("labels")
            .and_then(Value::as_object)
            .is_some_and(|labels| labels.contains_key(label));
        if !has {
            return false;
        }
    }
    if let Some(arg) = args.get("uri") {
        let Some(pattern) = arg.as_str() else {
            return false;
        };
        let uri_hit = match value.get("uri") {
            Some(Value::String(u)) => pattern_search(pattern, u),
            _ => false,
        };
        let uris_hit = value
            .get("uris")
            .and_then(Value::as_array)
            .is_some_and(|uris| {
                uris.iter()
                    .filter_map(Value::as_str)
                    .any(|u| pattern_search(pattern, u))
            });
        if !uri_hit && !uris_hit {
            return false;
        }
    }
    if let Some(arg) = args.get("filter") {
        let Some(spec) = arg.as_str() else {
            return false;
        };
        let filters = decode_args(spec, 100);
        for field in filter_fields {
            let Some(wanted) = filters.get(field) else {
                continue;
            };
            // A repeated key compares its last value; a bare key is `true`, never equal.
            let wanted = match wanted {
                Arg::Many(list) => list.last(),
                other => Some(other),
            };
            let stored = value.get(*field);
            if matches!(stored, None | Some(Value::Bool(false))) {
                return false;
            }
            // No type conversion: an integer id never equals the string argument.
            match (stored, wanted.and_then(Arg::as_str)) {
                (Some(Value::String(s)), Some(w)) if s == w => {}
                _ => return false,
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, rev: i64, value: Value) -> Item {
        Item {
            key: format!("/apisix/routes/{id}"),
            value,
            create_revision: rev,
            mod_revision: rev,
        }
    }

    /// What the store's page gives is what paging the whole directory gives.
    #[test]
    fn a_store_page_answers_as_the_whole_directory_paged() {
        let items: Vec<Item> = (0..37)
            .map(|i| {
                item(
                    &format!("{:02}", (i * 7) % 37),
                    100 - i / 2,
                    json!({"i": i}),
                )
            })
            .collect();
        let mut by_key = items.clone();
        by_key.sort_by(|a, b| a.key.cmp(&b.key));
        let mut created = by_key.clone();
        created.sort_by_key(|i| i.create_revision);
        for query in [
            "page=1&page_size=10",
            "page=4&page_size=10",
            "page=5&page_size=10",
            "page=0&page_size=10",
            "page=-3&page_size=10",
            "page=2&page_size=20",
            "page=99999999999999999999&page_size=10",
        ] {
            let args = Args::parse(Some(query));
            let (offset, limit) = store_page(&args).expect(query);
            let page: Vec<Item> = created.iter().skip(offset).take(limit).cloned().collect();
            assert_eq!(
                paged_answer(&page, created.len()),
                list(by_key.clone(), query),
                "{query}"
            );
        }
        for query in [
            "page=1&page_size=5",
            "page=1.5&page_size=10",
            "page=1&page_size=10.5",
            "page=1&page_size=10&name=x",
            "page=1&page_size=10&label",
            "page=1&page_size=10&uri=/a",
            "page=1&page_size=10&filter=service_id%3D1",
            "page=1",
            "page_size=10",
            "page=x&page_size=10",
        ] {
            assert_eq!(store_page(&Args::parse(Some(query))), None, "{query}");
        }
    }

    fn list(items: Vec<Item>, query: &str) -> Value {
        match answer(
            items,
            &Args::parse(Some(query)),
            &["service_id", "upstream_id"],
        ) {
            ListAnswer::Json(v) => v,
            ListAnswer::BadPageSize => json!("bad page size"),
        }
    }

    fn ids(v: &Value) -> Vec<String> {
        v["list"]
            .as_array()
            .map(|l| {
                l.iter()
                    .map(|i| i["value"]["id"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn name_filter_is_a_regex_search_and_nameless_items_read_nil() {
        let items = vec![
            item("1", 1, json!({"id": "1", "name": "1"})),
            item("2", 2, json!({"id": "2", "name": "21"})),
            item("3", 3, json!({"id": "3", "name": "x"})),
            item("4", 4, json!({"id": "4"})),
        ];
        assert_eq!(ids(&list(items.clone(), "name=1")), ["1", "2"]);
        assert_eq!(ids(&list(items.clone(), "name=i")), ["4"]);
        let v = list(items, "name=nomatch");
        assert_eq!(v, json!({"list": [], "total": 0}));
    }

    #[test]
    fn label_uri_and_filter() {
        let items = vec![
            item(
                "1",
                1,
                json!({"id": "1", "uri": "/a", "labels": {"k": "v"}, "upstream_id": "9"}),
            ),
            item(
                "2",
                2,
                json!({"id": "2", "uris": ["/b", "/ab"], "upstream_id": 9}),
            ),
            item("3", 3, json!({"id": "3", "uri": "/c", "service_id": "9"})),
        ];
        assert_eq!(ids(&list(items.clone(), "label=k")), ["1"]);
        assert_eq!(ids(&list(items.clone(), "label=v")), Vec::<String>::new());
        assert_eq!(ids(&list(items.clone(), "uri=a")), ["1", "2"]);
        assert_eq!(ids(&list(items.clone(), "filter=upstream_id%3D9")), ["1"]);
        assert_eq!(
            ids(&list(items.clone(), "filter=service_id%3D9%26other%3Dx")),
            ["3"]
        );
    }

    #[test]
    fn paging() {
        let items: Vec<Item> = (1..=12)
            .map(|i| item(&i.to_string(), 100 - i, json!({"id": i.to_string()})))
            .collect();
        let v = list(items.clone(), "page=1&page_size=10");
        assert_eq!(v["total"], 12);
        assert_eq!(ids(&v)[0], "12", "sorted by createdIndex");
        assert_eq!(ids(&list(items.clone(), "page=2&page_size=10")).len(), 2);
        assert_eq!(
            list(items.clone(), "page=3&page_size=10")["list"],
            json!({})
        );
        assert_eq!(ids(&list(items.clone(), "page=0&page_size=10")).len(), 10);
        assert_eq!(
            ids(&list(items.clone(), "page=x&page_size=5")).len(),
            12,
            "paging needs both numbers"
        );
        assert_eq!(list(items, "page=1&page_size=5"), json!("bad page size"));
    }
}
