//! Reading requests: query strings, JSON bodies and path ids, each refusal a 400 that
//! says what is wrong.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::Json;
use serde::de::DeserializeOwned;

use crate::admin::error::ApiError;
use crate::operations::PageRequest;

/// A query string read into `T`.
pub(super) fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("bad query: {}", e.body_text())))
}

/// A list's query string: its page (`limit`, `after`) and the rest read into `T` (a
/// filter), each refusing what it does not know.
pub(super) fn paged<T: DeserializeOwned>(raw: Option<&str>) -> Result<(PageRequest, T), ApiError> {
    split(raw, &["limit", "after"])
}

/// A query string read into two parts: `A` takes the parameters named in `names`, `B`
/// the rest, each refusing what it does not know.
pub(super) fn split<A: DeserializeOwned, B: DeserializeOwned>(
    raw: Option<&str>,
    names: &[&str],
) -> Result<(A, B), ApiError> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(raw.unwrap_or("")).map_err(bad_query)?;
    let (first, rest): (Vec<_>, Vec<_>) =
        (pairs.into_iter()).partition(|(name, _)| names.contains(&name.as_str()));
    Ok((read_pairs(first)?, read_pairs(rest)?))
}

/// `pairs` of a query string read into `T`; a refusal names the parameter it is about
/// (the decoder's own words do not: "invalid digit found in string").
fn read_pairs<T: DeserializeOwned>(pairs: Vec<(String, String)>) -> Result<T, ApiError> {
    let encode = |pairs: &[(String, String)]| {
        serde_urlencoded::to_string(pairs).expect("pairs of texts encode")
    };
    serde_urlencoded::from_str(&encode(&pairs)).map_err(|error| {
        let alone = |pair: &(String, String)| {
            serde_urlencoded::from_str::<T>(&encode(std::slice::from_ref(pair))).err()
        };
        match pairs.iter().find_map(|pair| Some((pair, alone(pair)?))) {
            Some(((name, value), error)) => {
                ApiError::bad_request(format!("bad query: {name}={value:?}: {error}"))
            }
            None => bad_query(error),
        }
    })
}

fn bad_query(error: serde_urlencoded::de::Error) -> ApiError {
    ApiError::bad_request(format!("bad query: {error}"))
}

/// A JSON body read into `T`.
pub(super) fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b)
        .map_err(|e| ApiError::bad_request(format!("bad body: {}", e.body_text())))
}

/// The id in the path: a positive integer naming a `what` ("task", "replay job").
pub(super) fn id(path: Result<Path<String>, PathRejection>, what: &str) -> Result<i64, ApiError> {
    let Path(text) = path.map_err(|e| ApiError::bad_request(e.body_text()))?;
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            ApiError::bad_request(format!("{text:?} is not a {what} id (a positive integer)"))
        })
}

/// The name in the path (a handler, a route).
pub(super) fn name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(name)| name)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// Whether a request asks for an answer counted now rather than one shared from the last
/// seconds: `Cache-Control: no-cache`, `no-store` or `max-age=0` (any spelling of zero,
/// quoted or not), or the HTTP/1.0 `Pragma: no-cache`. Case does not matter.
pub(super) fn asks_fresh(headers: &axum::http::HeaderMap) -> bool {
    use axum::http::header::{CACHE_CONTROL, PRAGMA};
    let directives = |name| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(|directive| directive.trim().to_ascii_lowercase())
            .collect::<Vec<_>>()
    };
    let no_cache = |d: &String| d == "no-cache";
    directives(CACHE_CONTROL).iter().any(|directive| {
        no_cache(directive) || directive == "no-store" || {
            let age = directive
                .strip_prefix("max-age=")
                .map(|a| a.trim_matches('"'));
            age.is_some_and(|a| !a.is_empty() && a.bytes().all(|b| b == b'0'))
        }
    }) || directives(PRAGMA).iter().any(no_cache)
}

#[cfg(test)]
mod tests {
    use super::asks_fresh;
    use axum::http::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_bytes(value).unwrap());
        }
        map
    }

    #[test]
    fn a_fresh_count_is_asked_by_every_spelling_of_no_cache_and_only_by_them() {
        let fresh: &[&[(&str, &[u8])]] = &[
            &[("cache-control", b"no-cache")],
            &[("cache-control", b"private, NO-CACHE")],
            &[("cache-control", b"no-store")],
            &[("cache-control", b"max-age=0")],
            &[("cache-control", b"max-age=00")],
            &[("cache-control", b"max-age=\"0\"")],
            &[
                ("cache-control", b"public"),
                ("cache-control", b" no-cache "),
            ],
            &[("pragma", b"no-cache")],
            &[("pragma", b"No-Cache")],
        ];
        let shared: &[&[(&str, &[u8])]] = &[
            &[],
            &[("cache-control", b"max-age=10")],
            &[("cache-control", b"max-age=")],
            &[("cache-control", b"max-age=0x0")],
            &[("cache-control", b"max-age=-0")],
            &[("cache-control", b"no-cache-please")],
            &[("cache-control", b"no-transform")],
            &[("cache-control", b"\xffno-cache")],
            &[("pragma", b"no-store")],
            &[("x-cache-control", b"no-cache")],
        ];
        for case in fresh {
            let map = headers(case);
            assert!(asks_fresh(&map), "{map:?} asks for a fresh count");
        }
        for case in shared {
            let map = headers(case);
            assert!(!asks_fresh(&map), "{map:?} takes a shared answer");
        }
    }
}
