//! The transform's tests: the ops' rules, the checks of a spec, fidelity, hostile
//! payloads, and the parser held against serde_json on random documents.

use super::node::Node;
use super::*;
use super::{read, write};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn transform(spec: &str) -> Transform {
    Transform::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The outcome as one string: `= bytes`, `unchanged` or `! reason`.
fn outcome(applied: &Applied) -> String {
    match applied {
        Applied::Changed { bytes, .. } => format!("= {}", String::from_utf8_lossy(bytes)),
        Applied::Unchanged => "unchanged".to_owned(),
        Applied::Failed(why) => format!("! {why}"),
    }
}

/// Runs each case (spec, payload, expected): `= exact output`, `unchanged`, or
/// `! part of the reason`.
fn check(cases: &[(&str, &str, &str)]) {
    let mut wrong = Vec::new();
    for (spec, payload, expected) in cases {
        let got = outcome(&transform(spec).apply(payload.as_bytes()));
        let ok = match expected.strip_prefix("! ") {
            Some(part) => got.starts_with("! ") && got.contains(part),
            None => got == *expected,
        };
        if !ok {
            wrong.push(format!(
                "{spec}\n  on {payload}\n  expected {expected}\n  got      {got}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn set(path: &str, value: &str) -> String {
    format!(r#"[{{"op":"set","path":"{path}","value":{value}}}]"#)
}

fn remove(path: &str) -> String {
    format!(r#"[{{"op":"remove","path":"{path}"}}]"#)
}

fn rename(from: &str, path: &str) -> String {
    format!(r#"[{{"op":"rename","from":"{from}","path":"{path}"}}]"#)
}

fn map(path: &str, from: &str, to: &str) -> String {
    format!(r#"[{{"op":"map","path":"{path}","from_value":{from},"to":{to}}}]"#)
}

#[test]
fn set_replaces_adds_and_refuses_what_it_cannot_reach() {
    let cases = [
        (
            set("/customer/tier", r#""gold""#),
            r#"{"customer":{"tier":"silver","id":1}}"#,
            r#"= {"customer":{"tier":"gold","id":1}}"#,
        ),
        (
            set("/customer/tier", r#""gold""#),
            r#"{"customer":{"id":1},"z":0}"#,
            r#"= {"customer":{"id":1,"tier":"gold"},"z":0}"#,
        ),
        (
            set("/customer/tier", r#""gold""#),
            r#"{"x":1}"#,
            "! op 0 (set /customer/tier): /customer is missing",
        ),
        (set("/a/b/c", "1"), r#"{"a":{}}"#, "! /a/b is missing"),
        (
            set("/a/b", "1"),
            r#"{"a":"text"}"#,
            "! /a is a string, not an object or an array",
        ),
        (
            set("/a/b", "1"),
            r#"{"a":null}"#,
            "! /a is null, not an object or an array",
        ),
        (
            set("/items/1", "9"),
            r#"{"items":[1,2,3]}"#,
            r#"= {"items":[1,9,3]}"#,
        ),
        (
            set("/items/0", "9"),
            r#"{"items":[1]}"#,
            r#"= {"items":[9]}"#,
        ),
        (
            set("/items/3", "9"),
            r#"{"items":[1,2,3]}"#,
            "! index 3 is past the end of /items (length 3)",
        ),
        (
            set("/items/99999999999999999999999", "9"),
            r#"{"items":[1]}"#,
            "! past the end of /items",
        ),
        (
            set("/items/01", "9"),
            r#"{"items":[1,2]}"#,
            "! /items is an array and \"01\" is not an array index (an index has no leading zero)",
        ),
        (
            set("/items/00", "9"),
            r#"{"items":[1,2]}"#,
            "! leading zero",
        ),
        (
            set("/items/x", "9"),
            r#"{"items":[1,2]}"#,
            "! \"x\" is not an array index",
        ),
        (
            set("/items/0/name", r#""n""#),
            r#"{"items":[{"id":1}]}"#,
            r#"= {"items":[{"id":1,"name":"n"}]}"#,
        ),
        (set("/0", "5"), "[1,2]", "= [5,2]"),
        // An object's key may look like an index, leading zero and all.
        (
            set("/m/01", "2"),
            r#"{"m":{"01":1}}"#,
            r#"= {"m":{"01":2}}"#,
        ),
        (
            set("/m/00", "2"),
            r#"{"m":{"0":1}}"#,
            r#"= {"m":{"0":1,"00":2}}"#,
        ),
        // Escapes in pointers: ~1 is /, ~0 is ~.
        (
            set("/a~1b", "2"),
            r#"{"a/b":1,"a":{"b":0}}"#,
            r#"= {"a/b":2,"a":{"b":0}}"#,
        ),
        (set("/m~0n", "2"), r#"{"m~n":1}"#, r#"= {"m~n":2}"#),
        (set("/~01", "2"), r#"{"~1":1,"/":0}"#, r#"= {"~1":2,"/":0}"#),
        (set("/new~1key", "true"), r#"{}"#, r#"= {"new/key":true}"#),
        // Keys are compared decoded; the key keeps its written form.
        (set("/ab", "2"), r#"{"a\u0062":1}"#, r#"= {"a\u0062":2}"#),
        (set("/é", "2"), r#"{"\u00e9":1}"#, r#"= {"\u00e9":2}"#),
        // The empty key.
        (set("/", "2"), r#"{"":1}"#, r#"= {"":2}"#),
        // The same text: nothing changes; another text of the same value is a change.
        (set("/a", r#""x""#), r#"{"a":"x"}"#, "unchanged"),
        (set("/a", "1"), r#"{"a": 1}"#, "unchanged"),
        (set("/a", "1"), r#"{"a":1.0}"#, r#"= {"a":1}"#),
        // Literals: objects keep their key order; strings are escaped as serde_json does.
        (
            set("/v", r#"{"b":1,"a":[true,null,{}]}"#),
            "{}",
            r#"= {"v":{"b":1,"a":[true,null,{}]}}"#,
        ),
        (
            set("/v", r#""line\n \"q\" \u00e9 \/""#),
            "{}",
            r#"= {"v":"line\n \"q\" é /"}"#,
        ),
        (set("/v", "1e2"), "{}", r#"= {"v":100.0}"#),
        (set("/v", "-7"), "{}", r#"= {"v":-7}"#),
        (set("/v", "null"), r#"{"v":1}"#, r#"= {"v":null}"#),
    ];
    let cases: Vec<(&str, &str, &str)> =
        cases.iter().map(|(s, p, e)| (s.as_str(), *p, *e)).collect();
    check(&cases);
}

#[test]
fn remove_takes_members_and_elements_and_ignores_what_is_absent() {
    let cases = [
        (
            remove("/legacy"),
            r#"{"a":1,"legacy":{"x":[1]},"b":2}"#,
            r#"= {"a":1,"b":2}"#,
        ),
        (remove("/legacy"), r#"{"a":1}"#, "unchanged"),
        (remove("/x/y/z"), r#"{"a":1}"#, "unchanged"),
        (
            remove("/items/0"),
            r#"{"items":[1,2,3]}"#,
            r#"= {"items":[2,3]}"#,
        ),
        (
            remove("/items/2"),
            r#"{"items":[1,2,3]}"#,
            r#"= {"items":[1,2]}"#,
        ),
        (remove("/items/3"), r#"{"items":[1,2,3]}"#, "unchanged"),
        (
            remove("/items/01"),
            r#"{"items":[1,2,3]}"#,
            "! leading zero",
        ),
        (
            remove("/items/x"),
            r#"{"items":[1,2,3]}"#,
            "! /items is an array and \"x\" is not an array index",
        ),
        (
            remove("/a/b"),
            r#"{"a":1}"#,
            "! op 0 (remove /a/b): /a is a number, not an object or an array",
        ),
        (remove("/a~1b"), r#"{"a/b":1,"c":2}"#, r#"= {"c":2}"#),
        (remove("/ab"), r#"{"a\u0062":1,"c":2}"#, r#"= {"c":2}"#),
        (remove("/1"), "[0,1,2]", "= [0,2]"),
        (
            remove("/a"),
            "null",
            "! the payload's root is null, not an object or an array",
        ),
    ];
    let cases: Vec<(&str, &str, &str)> =
        cases.iter().map(|(s, p, e)| (s.as_str(), *p, *e)).collect();
    check(&cases);
}

#[test]
fn rename_moves_a_value_to_an_absent_place() {
    let cases = [
        // Within one object the member keeps its place.
        (
            rename("/amount", "/amount_cents"),
            r#"{"id":1,"amount":5,"currency":"EUR"}"#,
            r#"= {"id":1,"amount_cents":5,"currency":"EUR"}"#,
        ),
        (
            rename("/a/x", "/a/y"),
            r#"{"a":{"x":1,"z":2}}"#,
            r#"= {"a":{"y":1,"z":2}}"#,
        ),
        // Elsewhere it is added at the end of its new object.
        (
            rename("/a/x", "/b/x"),
            r#"{"a":{"x":1,"y":2},"b":{"z":3}}"#,
            r#"= {"a":{"y":2},"b":{"z":3,"x":1}}"#,
        ),
        (
            rename("/a/x", "/x"),
            r#"{"a":{"x":[1,{"k":2}]},"b":0}"#,
            r#"= {"a":{},"b":0,"x":[1,{"k":2}]}"#,
        ),
        (
            rename("/items/0", "/first"),
            r#"{"items":[1,2]}"#,
            r#"= {"items":[2],"first":1}"#,
        ),
        (
            rename("/amount", "/amount_cents"),
            r#"{"id":1}"#,
            "unchanged",
        ),
        // `from` absent: nothing changes, whatever `path` is.
        (rename("/amount", "/nowhere/x"), r#"{"id":1}"#, "unchanged"),
        (
            rename("/amount", "/amount_cents"),
            r#"{"amount":1,"amount_cents":2}"#,
            "! op 0 (rename /amount → /amount_cents): /amount_cents is already present",
        ),
        (
            rename("/amount", "/c/amount"),
            r#"{"amount":1}"#,
            "! /c is missing",
        ),
        (
            rename("/amount", "/c/amount"),
            r#"{"amount":1,"c":"s"}"#,
            "! /c is a string, not an object or an array",
        ),
        (
            rename("/amount", "/c/5"),
            r#"{"amount":1,"c":[0]}"#,
            "! /c is an array: rename adds a member to an object",
        ),
        (
            rename("/items/0", "/items/1"),
            r#"{"items":[1]}"#,
            "! /items is an array: rename adds a member to an object",
        ),
        (rename("/a~1b", "/m~0n"), r#"{"a/b":1}"#, r#"= {"m~n":1}"#),
        // The new key is written as serde_json writes it.
        (
            rename("/a", "/qu\\\"ote"),
            r#"{"a":1}"#,
            r#"= {"qu\"ote":1}"#,
        ),
        (rename("/ab", "/cd"), r#"{"a\u0062":1}"#, r#"= {"cd":1}"#),
    ];
    let cases: Vec<(&str, &str, &str)> =
        cases.iter().map(|(s, p, e)| (s.as_str(), *p, *e)).collect();
    check(&cases);
}

#[test]
fn map_replaces_a_value_equal_to_from_value() {
    let cases = [
        (
            map("/currency", r#""EUR""#, r#""eur""#),
            r#"{"currency":"EUR","n":1}"#,
            r#"= {"currency":"eur","n":1}"#,
        ),
        (
            map("/currency", r#""EUR""#, r#""eur""#),
            r#"{"currency":"USD"}"#,
            "unchanged",
        ),
        (
            map("/currency", r#""EUR""#, r#""eur""#),
            r#"{"other":"EUR"}"#,
            "unchanged",
        ),
        (
            map("/currency", r#""EUR""#, r#""eur""#),
            r#"{"currency":"\u0045UR"}"#,
            r#"= {"currency":"eur"}"#,
        ),
        (
            map("/currency", r#""EUR""#, r#""eur""#),
            r#"{"currency":["EUR"]}"#,
            "unchanged",
        ),
        // Numbers by value.
        (map("/n", "1", "2"), r#"{"n":1.0}"#, r#"= {"n":2}"#),
        (map("/n", "1", "2"), r#"{"n":1e0}"#, r#"= {"n":2}"#),
        (map("/n", "1", "2"), r#"{"n":10E-1}"#, r#"= {"n":2}"#),
        (map("/n", "1", "2"), r#"{"n":0.1e1}"#, r#"= {"n":2}"#),
        (
            map("/n", "1", "2"),
            r#"{"n":1.0000000000000000000001}"#,
            "unchanged",
        ),
        (map("/n", "100", "2"), r#"{"n":1E+2}"#, r#"= {"n":2}"#),
        (map("/n", "0", "2"), r#"{"n":-0}"#, r#"= {"n":2}"#),
        (map("/n", "0", "2"), r#"{"n":-0.0e-5}"#, r#"= {"n":2}"#),
        (map("/n", "1", "2"), r#"{"n":"1"}"#, "unchanged"),
        (map("/n", "1", "2"), r#"{"n":true}"#, "unchanged"),
        (map("/n", "0.5", "2"), r#"{"n":5e-1}"#, r#"= {"n":2}"#),
        (map("/n", "-3", "2"), r#"{"n":3}"#, "unchanged"),
        // Containers: objects in any key order, arrays in order.
        (
            map("/o", r#"{"a":1,"b":[2]}"#, "null"),
            r#"{"o":{"b":[2.0],"a":1}}"#,
            r#"= {"o":null}"#,
        ),
        (
            map("/o", r#"{"a":1,"b":[2]}"#, "null"),
            r#"{"o":{"b":[2],"a":1,"c":3}}"#,
            "unchanged",
        ),
        (map("/o", "[1,2]", "null"), r#"{"o":[2,1]}"#, "unchanged"),
        (map("/o", "null", "0"), r#"{"o":null}"#, r#"= {"o":0}"#),
        // A replacement with the same text is no change.
        (
            map("/c", r#""EUR""#, r#""EUR""#),
            r#"{"c":"EUR"}"#,
            "unchanged",
        ),
        (
            map("/items/1", r#""b""#, r#""B""#),
            r#"{"items":["a","b"]}"#,
            r#"= {"items":["a","B"]}"#,
        ),
        (
            map("/items/5", r#""b""#, r#""B""#),
            r#"{"items":["a","b"]}"#,
            "unchanged",
        ),
        (
            map("/items/b", r#""b""#, r#""B""#),
            r#"{"items":["a","b"]}"#,
            "! \"b\" is not an array index",
        ),
    ];
    let cases: Vec<(&str, &str, &str)> =
        cases.iter().map(|(s, p, e)| (s.as_str(), *p, *e)).collect();
    check(&cases);
}

#[test]
fn objects_with_many_keys_compare_in_any_order() {
    let keys: Vec<String> = (0..40).map(|i| format!(r#""k{i}":{i}"#)).collect();
    let forward = format!("{{{}}}", keys.join(","));
    let backward = format!(
        "{{{}}}",
        keys.iter().rev().cloned().collect::<Vec<_>>().join(",")
    );
    let spec = map("/o", &forward, "1");
    check(&[(&spec, &format!(r#"{{"o":{backward}}}"#), r#"= {"o":1}"#)]);
    let other = backward.replace(r#""k7":7"#, r#""k7":8"#);
    check(&[(&spec, &format!(r#"{{"o":{other}}}"#), "unchanged")]);
}

#[test]
fn a_task_is_transformed_all_or_nothing_in_the_ops_order() {
    let spec = r#"[{"op":"set","path":"/a","value":1},{"op":"set","path":"/missing/x","value":1}]"#;
    check(&[(
        spec,
        r#"{"a":0}"#,
        "! op 1 (set /missing/x): /missing is missing",
    )]);
    // Later ops see what earlier ones did.
    let spec = r#"[{"op":"set","path":"/a","value":{}},{"op":"set","path":"/a/b","value":2},
                   {"op":"rename","from":"/a","path":"/c"},{"op":"remove","path":"/c/b"}]"#;
    check(&[(spec, r#"{"x":0}"#, r#"= {"x":0,"c":{}}"#)]);
    // Ops that together change nothing are still changes, each of them listed.
    let spec = r#"[{"op":"set","path":"/a","value":1},{"op":"set","path":"/a","value":0}]"#;
    let Applied::Changed { bytes, changes } = transform(spec).apply(br#"{"a":0}"#) else {
        panic!("changed")
    };
    assert_eq!(bytes, br#"{"a":0}"#);
    assert_eq!(changes.len(), 2);
    // A transform is not changed by running it.
    let t = transform(&set("/n", "1"));
    assert_eq!(t.apply(b"{}"), t.apply(b"{}"));
}

#[test]
fn changes_show_before_and_after_as_compact_json() {
    let spec = r#"[{"op":"set","path":"/customer/tier","value":"gold"},
                   {"op":"remove","path":"/legacy"},
                   {"op":"rename","from":"/amount","path":"/amount_cents"},
                   {"op":"map","path":"/currency","from_value":"EUR","to":"eur"}]"#;
    let payload = br#"{"customer": {"tier": "silver"}, "legacy": {"x": [1, 2]},
                       "amount": 1.50, "currency": "EUR"}"#;
    let Applied::Changed { bytes, changes } = transform(spec).apply(payload) else {
        panic!("changed")
    };
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        r#"{"customer":{"tier":"gold"},"amount_cents":1.50,"currency":"eur"}"#
    );
    let shown: Vec<String> = changes.iter().map(Change::to_string).collect();
    assert_eq!(
        shown,
        [
            r#"/customer/tier: "silver" → "gold""#,
            r#"/legacy: {"x":[1,2]} → (absent)"#,
            "/amount: 1.50 → (absent)",
            "/amount_cents: (absent) → 1.50",
            r#"/currency: "EUR" → "eur""#,
        ]
    );
    assert_eq!(
        changes[4],
        Change {
            path: "/currency".into(),
            before: Some(r#""EUR""#.into()),
            after: Some(r#""eur""#.into()),
        }
    );
    // Added: no before.
    let Applied::Changed { changes, .. } = transform(&set("/n", "[1]")).apply(b"{}") else {
        panic!("changed")
    };
    assert_eq!(changes[0].to_string(), "/n: (absent) → [1]");
}

#[test]
fn a_change_cuts_a_long_value_after_200_characters() {
    for piece in ["x", "é", "😀", "\\u00e9"] {
        let long = piece.repeat(1000);
        let payload = format!(
            r#"{{"s":"{long}","big":[{}]}}"#,
            vec!["12345"; 100_000].join(",")
        );
        let spec = r#"[{"op":"remove","path":"/s"},{"op":"remove","path":"/big"}]"#;
        let Applied::Changed { bytes, changes } = transform(spec).apply(payload.as_bytes()) else {
            panic!("changed")
        };
        assert_eq!(bytes, b"{}");
        for change in &changes {
            let before = change.before.as_deref().unwrap();
            assert_eq!(before.chars().count(), 201, "{before}");
            assert!(before.ends_with('…'));
        }
        assert!(changes[0]
            .before
            .as_deref()
            .unwrap()
            .starts_with(&format!("\"{piece}")));
    }
    // Short enough: whole, no ellipsis (200 characters exactly).
    let exact = format!(r#"{{"s":"{}"}}"#, "y".repeat(198));
    let Applied::Changed { changes, .. } = transform(&remove("/s")).apply(exact.as_bytes()) else {
        panic!("changed")
    };
    assert_eq!(changes[0].before.as_deref().unwrap().chars().count(), 200);
    assert!(!changes[0].before.as_deref().unwrap().ends_with('…'));
}

#[test]
fn untouched_parts_keep_their_order_numbers_and_escapes() {
    let payload = r#"  {"id": 12345678901234567890123, "x": 1.0, "y": 1e2, "z": -0, "w": 1E+2,
        "v": 1.50, "huge": 1e400, "tiny": -1.0e-400, "s": "\u00e9\n\/\"\\", "k":[ 1 , 2 ],
        "a\u0062": {"z": 1, "a": 2, "m": [{"y": 0, "b": 0}]}, "pair": "\ud83d\ude00", "é": "é"}
    "#;
    let expected = r#"{"id":12345678901234567890123,"x":1.0,"y":1e2,"z":-0,"w":1E+2,"v":1.50,"huge":1e400,"tiny":-1.0e-400,"s":"\u00e9\n\/\"\\","k":[1,2],"a\u0062":{"z":1,"a":2,"m":[{"y":0,"b":0}]},"pair":"\ud83d\ude00","é":"é","new":1}"#;
    check(&[(&set("/new", "1"), payload, &format!("= {expected}"))]);
    // The written form of a key is kept when its value changes.
    let expected = r#"{"id":12345678901234567890123,"x":1.0,"y":1e2,"z":-0,"w":1E+2,"v":1.50,"huge":1e400,"tiny":-1.0e-400,"s":"\u00e9\n\/\"\\","k":[1,2],"a\u0062":{"z":1,"a":2,"m":[{"y":0,"b":1}]},"pair":"\ud83d\ude00","é":"é"}"#;
    check(&[(&set("/ab/m/0/b", "1"), payload, &format!("= {expected}"))]);
}

#[test]
fn hostile_payloads_fail_cleanly() {
    let t = transform(&set("/a", "1"));
    let fails = |payload: &[u8], part: &str| {
        let got = outcome(&t.apply(payload));
        assert!(
            got.starts_with("! ") && got.contains(part),
            "{part}: got {got}"
        );
    };
    fails(
        b"{\"a\":\"\xff\"}",
        "the payload is not UTF-8: an invalid byte at byte 6",
    );
    fails(
        b"\xef\xbb\xbf{}",
        "the payload is not JSON: expected a value, found '\\u{feff}' at byte 0",
    );
    fails(
        b"",
        "the payload is not JSON: expected a value, found the end at byte 0",
    );
    fails(b"  \n ", "found the end at byte 4");
    fails(
        b"null",
        "the payload's root is null, not an object or an array",
    );
    fails(b"5", "the payload's root is a number");
    fails(b"\"s\"", "the payload's root is a string");
    fails(b"true", "the payload's root is a boolean");
    fails(
        &vec![b'['; 1_000_000],
        "arrays and objects nested deeper than 127 levels at byte 127",
    );
    fails(
        &b"{\"a\":".repeat(1_000_000),
        "nested deeper than 127 levels",
    );
    fails(
        br#"{"a":1,"a":2}"#,
        r#"the payload is not JSON: duplicate key "a" in the object at byte 0"#,
    );
    fails(
        br#"{"x":[{"a":1,"\u0061":2}]}"#,
        r#"duplicate key "a" in the object at byte 6"#,
    );
    fails(
        b"{\"a\":\"x\ty\"}",
        "a raw control character U+0009 in a string (it must be escaped) at byte 7",
    );
    fails(b"{\"a\":\"x\ny\"}", "raw control character U+000A");
    fails(b"{\"a\":\"x\x00\"}", "raw control character U+0000");
    fails(br#"{"a":1,}"#, "a trailing comma before } at byte 7");
    fails(br#"[1,]"#, "a trailing comma before ] at byte 3");
    fails(br#"{"a":01}"#, "a number with a leading zero at byte 6");
    fails(br#"{"a":"\x"}"#, r"an invalid escape \x at byte 6");
    fails(
        br#"{"a":"\ud800"}"#,
        r"a lone surrogate \uD800 in a string at byte 6",
    );
    fails(br#"{"a":"\udc00x"}"#, r"a lone surrogate \uDC00");
    fails(br#"{"a":"\ud800\u0041"}"#, r"a lone surrogate \uD800");
    fails(br#"{"a":"\u12"}"#, r"a \u escape without four hex digits");
    fails(br#"{"a":1} x"#, "found 'x' after the value at byte 8");
    fails(br#"{}{}"#, "found '{' after the value at byte 2");
    fails(br#"{"a" 1}"#, "expected : after a key");
    fails(br#"{a:1}"#, "expected a key, found 'a'");
    fails(br#"{"a":tru}"#, "expected true");
    fails(br#"{"a":"open"#, "a string without its closing quote");
    // Many keys: the check of a key written twice does not compare each pair.
    let keys: Vec<String> = (0..50_000).map(|i| format!(r#""k{i}":0"#)).collect();
    let payload = format!(r#"{{{},"k123":1}}"#, keys.join(","));
    fails(payload.as_bytes(), r#"duplicate key "k123""#);
}

#[test]
fn the_depth_limit_is_serde_json_s_and_a_result_may_not_pass_it() {
    for depth in [126, 127, 128, 129] {
        let doc = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let ours = read::parse(&doc).is_ok();
        let theirs = serde_json::from_str::<serde_json::Value>(&doc).is_ok();
        assert_eq!(ours, theirs, "depth {depth}");
        assert_eq!(ours, depth <= MAX_DEPTH, "depth {depth}");
    }
    // 127 objects deep: a scalar may go at the bottom, a container may not.
    let doc = format!("{}0{}", r#"{"a":"#.repeat(127), "}".repeat(127));
    let bottom = "/a".repeat(127);
    check(&[
        (
            &set(&bottom, "1"),
            &doc,
            &format!("= {}1{}", r#"{"a":"#.repeat(127), "}".repeat(127)),
        ),
        (
            &set(&bottom, "[]"),
            &doc,
            "! the payload would nest deeper than 127 levels",
        ),
        (&map(&bottom, "0", "{}"), &doc, "! would nest deeper"),
    ]);
    let doc = format!(r#"{{"x":0,"deep":{}{}}}"#, "[".repeat(126), "]".repeat(126));
    check(&[(
        &rename("/deep", "/x2/y"),
        &format!(r#"{{"x2":{{}},{}"#, &doc[1..]),
        "! would nest deeper",
    )]);
}

#[test]
fn payloads_of_megabytes_are_transformed() {
    let member = r#""order-{i}": {"amount": 1.50, "currency": "EUR", "lines": [{"sku": "a\u00e9", "qty": 12345678901234567890}], "note": "  spaced  "}"#;
    let members: Vec<String> = (0..40_000)
        .map(|i| member.replace("{i}", &i.to_string()))
        .collect();
    let payload = format!("{{\n  {}\n}}", members.join(",\n  "));
    assert!(payload.len() > 5_000_000, "{}", payload.len());
    let spec = r#"[{"op":"rename","from":"/order-39999/amount","path":"/order-39999/amount_cents"},
                   {"op":"map","path":"/order-0/currency","from_value":"EUR","to":"eur"},
                   {"op":"set","path":"/order-20000/lines/0/qty","value":1},
                   {"op":"remove","path":"/order-1"}]"#;
    let Applied::Changed { bytes, changes } = transform(spec).apply(payload.as_bytes()) else {
        panic!("changed")
    };
    assert_eq!(changes.len(), 5);
    let out = String::from_utf8(bytes).unwrap();
    assert!(out.starts_with(r#"{"order-0":{"amount":1.50,"currency":"eur","lines":[{"sku":"a\u00e9","qty":12345678901234567890}],"note":"  spaced  "},"order-2":"#));
    assert!(out.ends_with(r#""order-39999":{"amount_cents":1.50,"currency":"EUR","lines":[{"sku":"a\u00e9","qty":12345678901234567890}],"note":"  spaced  "}}"#));
    assert!(out.contains(
        r#""order-20000":{"amount":1.50,"currency":"EUR","lines":[{"sku":"a\u00e9","qty":1}]"#
    ));
    // One string of 5 MB.
    let payload = format!(r#"{{"blob":"{}","n":1}}"#, "ab\\n".repeat(1_300_000));
    check(&[(
        &map("/n", "1", "2"),
        &payload,
        &format!(r#"= {{"blob":"{}","n":2}}"#, "ab\\n".repeat(1_300_000)),
    )]);
}

/// Expects `Transform::parse(spec)` to fail with exactly `message`.
fn refused(spec: &str, message: &str) {
    match Transform::parse(spec) {
        Ok(t) => panic!("{spec} was accepted: {t}"),
        Err(e) => assert_eq!(e.to_string(), message, "{spec}"),
    }
}

#[test]
fn a_spec_is_checked_and_its_errors_name_the_op_and_field() {
    refused("[]", "the transform has no ops");
    refused(
        "{}",
        "the transform must be a JSON array of ops, not an object",
    );
    refused(
        "",
        "the transform is not JSON: expected a value, found the end at byte 0",
    );
    refused(
        r#"[{"op":"remove","path":"/a"},]"#,
        "the transform is not JSON: a trailing comma before ] at byte 29",
    );
    refused(
        r#"[{"op":"remove","path":"/a","path":"/b"}]"#,
        r#"the transform is not JSON: duplicate key "path" in the object at byte 1"#,
    );
    refused("[1]", "op 0: an op is an object, not a number");
    refused(
        r#"[{"op":"frob","path":"/a"}]"#,
        "op 0: unknown variant `frob`, expected one of `set`, `remove`, `rename`, `map`",
    );
    refused(r#"[{"path":"/a"}]"#, "op 0: missing field `op`");
    refused(
        r#"[{"op":5,"path":"/a"}]"#,
        "op 0: invalid type: integer `5`, expected variant identifier",
    );
    refused(
        r#"[{"op":"set","path":"/a","value":1,"extra":2}]"#,
        "op 0 (set): unknown field `extra`, expected `path` or `value`",
    );
    refused(
        r#"[{"op":"set","path":"/a"}]"#,
        "op 0 (set): missing field `value`",
    );
    refused(
        r#"[{"op":"remove","path":5}]"#,
        "op 0 (remove): invalid type: integer `5`, expected a string",
    );
    refused(r#"[{"op":"set","path":"","value":1}]"#, "op 0 (set): path: the root pointer \"\" is not allowed: an op changes a part of the payload, never the whole");
    refused(r#"[{"op":"remove","path":""}]"#, "op 0 (remove): path: the root pointer \"\" is not allowed: an op changes a part of the payload, never the whole");
    refused(r#"[{"op":"map","path":"","from_value":1,"to":2}]"#, "op 0 (map): path: the root pointer \"\" is not allowed: an op changes a part of the payload, never the whole");
    refused(
        r#"[{"op":"remove","path":"/a"},{"op":"remove","path":"/b"},{"op":"rename","from":"amount","path":"/b"}]"#,
        "op 2 (rename): from: \"amount\" is not a JSON Pointer: it must start with /",
    );
    refused(r#"[{"op":"rename","from":"","path":"/b"}]"#, "op 0 (rename): from: the root pointer \"\" is not allowed: an op changes a part of the payload, never the whole");
    refused(r#"[{"op":"rename","from":"/a","path":""}]"#, "op 0 (rename): path: the root pointer \"\" is not allowed: an op changes a part of the payload, never the whole");
    refused(r#"[{"op":"remove","path":"/a~2"}]"#, "op 0 (remove): path: \"/a~2\" is not a JSON Pointer: token 1 has ~2: a ~ must be followed by 0 or 1");
    refused(r#"[{"op":"remove","path":"/a/b~"}]"#, "op 0 (remove): path: \"/a/b~\" is not a JSON Pointer: token 2 ends in ~: a ~ must be followed by 0 or 1");
    refused(
        r#"[{"op":"remove","path":"/-"}]"#,
        "op 0 (remove): path: \"/-\": the token - (past the end of an array) is not allowed",
    );
    refused(
        r#"[{"op":"set","path":"/items/-/x","value":1}]"#,
        "op 0 (set): path: \"/items/-/x\": the token - (past the end of an array) is not allowed",
    );
    refused(
        r#"[{"op":"rename","from":"/a","path":"/a"}]"#,
        "op 0 (rename): path: /a is /a or lies inside it",
    );
    refused(
        r#"[{"op":"rename","from":"/a","path":"/a/b"}]"#,
        "op 0 (rename): path: /a/b is /a or lies inside it",
    );
    refused(
        r#"[{"op":"rename","from":"/a/b","path":"/a"}]"#,
        "op 0 (rename): path: /a/b lies inside /a: wherever /a/b is, /a is present",
    );
    refused(r#"[{"op":"set","path":"/id","value":12345678901234567890123}]"#, "op 0 (set): value: the number 12345678901234567890123 cannot be kept exactly (it would be written 1.2345678901234568e+22); a literal number must fit an i64, a u64 or an f64");
    refused(r#"[{"op":"map","path":"/n","from_value":[0.10000000000000000001],"to":1}]"#, "op 0 (map): from_value: the number 0.10000000000000000001 cannot be kept exactly (it would be written 0.1); a literal number must fit an i64, a u64 or an f64");
    refused(
        r#"[{"op":"set","path":"/n","value":1e400}]"#,
        "op 0 (set): number out of range",
    );
    // Whitespace, escapes in strings, and numbers serde_json keeps are fine.
    transform(" [ { \"op\" : \"set\" , \"path\" : \"/\\u0061\" , \"value\" : [ 1.5e3, -0.25, 18446744073709551615, -9223372036854775808 ] } ] ");
}

#[test]
fn a_spec_of_up_to_100_ops_and_64_kib_is_read() {
    let op = r#"{"op":"remove","path":"/a"}"#;
    let ops = |n: usize| format!("[{}]", vec![op; n].join(","));
    assert!(Transform::parse(&ops(100)).is_ok());
    refused(
        &ops(101),
        "the transform has 101 ops, over the limit of 100",
    );
    let padded = |len: usize| {
        let spec = ops(1);
        format!("{spec}{}", " ".repeat(len - spec.len()))
    };
    assert!(Transform::parse(&padded(64 * 1024)).is_ok());
    refused(
        &padded(64 * 1024 + 1),
        "the transform is 65537 bytes, over the limit of 65536",
    );
}

#[test]
fn a_transform_serializes_as_its_ops_and_displays_one_line_each() {
    let spec = r#"[{"op": "set",    "path": "/customer/tier", "value": {"b": "gold", "a": [1.5, null]}},
                   {"op": "remove", "path": "/legacy"},
                   {"op": "rename", "from": "/amount", "path": "/amount_cents"},
                   {"op": "map",    "path": "/currency", "from_value": "EUR", "to": "eur"}]"#;
    let t = transform(spec);
    let json = serde_json::to_string(&t).unwrap();
    assert_eq!(
        json,
        r#"[{"op":"set","path":"/customer/tier","value":{"b":"gold","a":[1.5,null]}},{"op":"remove","path":"/legacy"},{"op":"rename","from":"/amount","path":"/amount_cents"},{"op":"map","path":"/currency","from_value":"EUR","to":"eur"}]"#
    );
    assert_eq!(serde_json::from_str::<Transform>(&json).unwrap(), t);
    assert_eq!(Transform::parse(&json).unwrap(), t);
    assert_eq!(json.parse::<Transform>().unwrap(), t);
    assert_eq!(
        t.to_string(),
        "set /customer/tier = {\"b\":\"gold\",\"a\":[1.5,null]}\n\
         remove /legacy\n\
         rename /amount → /amount_cents\n\
         map /currency: \"EUR\" → \"eur\""
    );
    // serde's way in checks the ops too.
    let e = serde_json::from_str::<Transform>(r#"[{"op":"remove","path":""}]"#).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("op 0 (remove): path: the root pointer"),
        "{e}"
    );
    let e = serde_json::from_str::<Transform>("[]").unwrap_err();
    assert!(e.to_string().starts_with("the transform has no ops"), "{e}");
    let e =
        serde_json::from_str::<Transform>(r#"[{"op":"remove","path":"/a","x":1}]"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `x`"), "{e}");
}

#[test]
fn pointers_decode_their_tokens_and_name_their_prefixes() {
    use super::pointer::{index, Pointer};
    let p = Pointer::parse("/a~1b/m~0n/~01/0/").unwrap();
    assert_eq!(p.tokens(), ["a/b", "m~n", "~1", "0", ""]);
    assert_eq!(p.prefix(0), "");
    assert_eq!(p.prefix(1), "/a~1b");
    assert_eq!(p.prefix(3), "/a~1b/m~0n/~01");
    assert_eq!(p.prefix(5), "/a~1b/m~0n/~01/0/");
    assert_eq!(p.last(), "");
    assert_eq!(p.to_string(), "/a~1b/m~0n/~01/0/");
    assert_eq!(Pointer::parse("/").unwrap().tokens(), [""]);
    assert_eq!(Pointer::parse("/--").unwrap().tokens(), ["--"]);
    assert!(Pointer::parse("/a/-").is_err());
    assert!(Pointer::parse("a").is_err());
    assert!(Pointer::parse("#/a").is_err());
    assert_eq!(index("0"), Ok(Some(0)));
    assert_eq!(index("10"), Ok(Some(10)));
    assert_eq!(index("99999999999999999999999"), Ok(None));
    for bad in ["", "00", "01", "-1", "+1", "1.0", " 1", "x"] {
        assert!(index(bad).is_err(), "{bad:?}");
    }
}

/// Inputs serde_json and this parser agree on, valid or not.
const CORPUS: &[&str] = &[
    "{}",
    "[]",
    " {} ",
    "\t[\n]\r\n",
    "[0]",
    "[-0]",
    "[0.0]",
    "[-0.0e-0]",
    "[1E+2]",
    "[1e-2]",
    "[123456789012345678901234567890]",
    "[1.7976931348623157e308]",
    "[1e-400]",
    r#"["\u00e9\ud83d\ude00\/\b\f\n\r\t\"\\"]"#,
    r#"{"":""}"#,
    "[\"\u{7f}\"]",
    "[\"é😀\"]",
    r#"{"a":[{"b":{"c":[null,true,false]}}]}"#,
    "[[],[[]],{}]",
    // Invalid.
    "",
    " ",
    "[",
    "]",
    "{",
    "[1,]",
    "[,1]",
    "[1,,2]",
    "{\"a\":1,}",
    "{,}",
    "{\"a\"}",
    "{\"a\":}",
    "{1:1}",
    "{'a':1}",
    "['a']",
    "[01]",
    "[-01]",
    "[00]",
    "[-]",
    "[1.]",
    "[.5]",
    "[1e]",
    "[1e+]",
    "[+1]",
    "[0x1]",
    "[NaN]",
    "[Infinity]",
    "[-Infinity]",
    "[1 2]",
    "[\"a\" \"b\"]",
    "[tru]",
    "[nul]",
    "[True]",
    "[\"\\x\"]",
    "[\"\\u12\"]",
    "[\"\\uZZZZ\"]",
    "[\"\\ud800\"]",
    "[\"\\udc00\"]",
    "[\"\\ud800\\ud800\"]",
    "[\"\\ud800x\"]",
    "[\"a\u{1}\"]",
    "[\"\t\"]",
    "[1] [2]",
    "[1]x",
    "/* c */ []",
    "[] // c",
    "\u{feff}[]",
    "[\"\\\"]",
    "[1]\u{0}",
];

#[test]
fn the_parser_agrees_with_serde_json_on_validity() {
    for text in CORPUS {
        let ours = read::parse(text);
        let theirs = serde_json::from_str::<serde_json::Value>(text);
        assert_eq!(
            ours.is_ok(),
            theirs.is_ok(),
            "{text:?}: ours {ours:?}, serde_json {theirs:?}"
        );
    }
    // Where they differ, on purpose: a key twice, a number beyond an f64.
    assert!(serde_json::from_str::<serde_json::Value>(r#"{"a":1,"a":2}"#).is_ok());
    assert!(read::parse(r#"{"a":1,"a":2}"#).is_err());
    assert!(serde_json::from_str::<serde_json::Value>("[1e400]").is_err());
    assert!(read::parse("[1e400]").is_ok());
}

/// Writes a random JSON document (depth at most `depth`); `canonical`: as serde_json
/// would write it (no whitespace, sorted keys, small integers, plain strings).
fn document(rng: &mut StdRng, depth: usize, canonical: bool, out: &mut String) {
    let space = |rng: &mut StdRng, out: &mut String| {
        if !canonical && rng.random_bool(0.3) {
            out.push_str([" ", "\n", "\t", "\r\n  "][rng.random_range(0..4)]);
        }
    };
    let kind = if depth == 0 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..7)
    };
    match kind {
        0 => out.push_str(["null", "true", "false"][rng.random_range(0..3)]),
        1 => {
            let number = if canonical {
                rng.random_range(-1000i64..1000).to_string()
            } else {
                let forms = [
                    "0",
                    "-0",
                    "1.50",
                    "1E+2",
                    "1e-2",
                    "-0.0",
                    "12345678901234567890123",
                    "3.14159",
                    "1e308",
                    "-2E-3",
                    "10.000",
                ];
                match rng.random_range(0..3) {
                    0 => forms[rng.random_range(0..forms.len())].to_owned(),
                    1 => rng.random_range(i64::MIN..i64::MAX).to_string(),
                    _ => format!(
                        "{}.{}e{}",
                        rng.random_range(-99..99),
                        rng.random_range(0..1000),
                        rng.random_range(-20..20)
                    ),
                }
            };
            out.push_str(&number);
        }
        2..=4 => {
            out.push('"');
            let pieces: &[&str] = if canonical {
                &["a", "b", "z", "0", " ", "é"]
            } else {
                &[
                    "a",
                    "é",
                    "😀",
                    "\\n",
                    "\\u00e9",
                    "\\ud83d\\ude00",
                    "\\/",
                    "\\\"",
                    "\\\\",
                    "\\t",
                    " ",
                    "\u{7f}",
                ]
            };
            for _ in 0..rng.random_range(0..6) {
                out.push_str(pieces[rng.random_range(0..pieces.len())]);
            }
            out.push('"');
        }
        5 => {
            out.push('[');
            for i in 0..rng.random_range(0..5) {
                if i > 0 {
                    out.push(',');
                }
                space(rng, out);
                document(rng, depth - 1, canonical, out);
                space(rng, out);
            }
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.random_range(0..5) {
                if i > 0 {
                    out.push(',');
                }
                space(rng, out);
                // Unique keys, in sorted order when canonical.
                let key = match (canonical, rng.random_range(0..3)) {
                    (true, _) | (false, 0) => format!("k{i}"),
                    (false, 1) => format!("\\u006b{i}"),
                    _ => format!("é/~{i}"),
                };
                out.push_str(&format!("\"{key}\""));
                space(rng, out);
                out.push(':');
                space(rng, out);
                document(rng, depth - 1, canonical, out);
            }
            out.push('}');
        }
    }
}

#[test]
fn random_documents_round_trip_and_mean_what_serde_json_reads() {
    let mut rng = StdRng::seed_from_u64(0x7e_d21e);
    let probe = transform(
        r#"[{"op":"set","path":"/__probe","value":1},{"op":"remove","path":"/__probe"}]"#,
    );
    let absent = transform(&remove("/__absent"));
    let past_the_end = transform(&remove("/999"));
    let mutations = [
        '{', '}', '[', ']', ',', ':', '"', '\\', '0', '-', '.', 'e', 't', ' ', '\u{1}', 'é',
    ];
    let (mut agreed_valid, mut agreed_invalid) = (0, 0);
    for round in 0..600 {
        let canonical = round % 3 == 0;
        let mut text = String::new();
        document(&mut rng, 5, canonical, &mut text);
        let node = read::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        let compact = write::compact(&node);
        // Our output reads back as the same tree, and writes the same bytes again.
        assert_eq!(read::parse(&compact).unwrap(), node, "{text}");
        assert_eq!(write::compact(&read::parse(&compact).unwrap()), compact);
        // serde_json reads the same document from the input and from our output.
        let theirs: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&compact).unwrap(),
            theirs,
            "{text}"
        );
        if canonical {
            assert_eq!(compact, serde_json::to_string(&theirs).unwrap(), "{text}");
        }
        // Ops that touch nothing leave it alone; ops that cancel out give the compact form.
        match node {
            Node::Object(_) => assert_eq!(absent.apply(text.as_bytes()), Applied::Unchanged),
            Node::Array(_) => assert_eq!(past_the_end.apply(text.as_bytes()), Applied::Unchanged),
            _ => {}
        }
        if let Node::Object(_) = node {
            let Applied::Changed { bytes, .. } = probe.apply(text.as_bytes()) else {
                panic!("{text}")
            };
            assert_eq!(String::from_utf8(bytes).unwrap(), compact);
        }
        // Broken copies: valid for us exactly when valid for serde_json (but for the two
        // differences on purpose).
        for _ in 0..8 {
            let mut broken: Vec<char> = text.chars().collect();
            let at = rng.random_range(0..=broken.len());
            match rng.random_range(0..3) {
                0 if at < broken.len() => {
                    broken.remove(at);
                }
                1 if at < broken.len() => {
                    broken[at] = mutations[rng.random_range(0..mutations.len())]
                }
                _ => broken.insert(at, mutations[rng.random_range(0..mutations.len())]),
            }
            let broken: String = broken.into_iter().collect();
            let ours = read::parse(&broken);
            let theirs = serde_json::from_str::<serde_json::Value>(&broken);
            match (&ours, &theirs) {
                (Ok(_), Ok(_)) => agreed_valid += 1,
                (Err(_), Err(_)) => agreed_invalid += 1,
                (Err(e), Ok(_)) if e.what.starts_with("duplicate key") => {}
                (Ok(_), Err(e)) if e.to_string().starts_with("number out of range") => {}
                _ => panic!("{broken:?}: ours {ours:?}, serde_json {theirs:?}"),
            }
        }
    }
    assert!(
        agreed_valid > 100 && agreed_invalid > 1000,
        "{agreed_valid} {agreed_invalid}"
    );
}
