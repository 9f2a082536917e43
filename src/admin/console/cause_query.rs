//! The causes page's query and addresses: what it shows (a grouping, a span, a class
//! whose causes alone are listed), read from its query and written into links, for the
//! page itself and for What broke's class rows.

use crate::store::GroupBy;

/// The spans offered: the parameter, its words, the trend's span and buckets.
pub(crate) const SINCE: [(&str, &str, &str, u32); 4] = [
    ("1h", "last hour", "1h", 12),
    ("1d", "last day", "1d", 24),
    ("7d", "last 7 days", "7d", 28),
    ("all", "any time", "1h", 12),
];

/// What the page shows: a grouping, a span, and a class whose causes alone are listed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CausesParams {
    /// What the groups are by.
    pub by: GroupBy,
    /// The span: a parameter of [`SINCE`].
    pub since: &'static str,
    /// The class whose causes alone are listed.
    pub class: Option<String>,
}

impl Default for CausesParams {
    fn default() -> Self {
        CausesParams {
            by: GroupBy::Cause,
            since: "all",
            class: None,
        }
    }
}

/// Reads the query; an unknown or repeated parameter, grouping or span is refused.
pub(crate) fn parse(pairs: &[(String, String)]) -> Result<CausesParams, String> {
    let mut params = CausesParams::default();
    let mut seen = std::collections::HashSet::new();
    for (name, value) in pairs {
        if !seen.insert(name.as_str()) {
            return Err(format!("give {name} once"));
        }
        let value = value.trim();
        match name.as_str() {
            "by" => params.by = value.parse()?,
            "since" => {
                params.since = SINCE
                    .iter()
                    .find(|(s, ..)| *s == value)
                    .map(|(s, ..)| *s)
                    .ok_or_else(|| format!("since is 1h, 1d, 7d or all (got {value:?})"))?
            }
            "class" if !value.is_empty() => params.class = Some(value.to_owned()),
            "class" => {}
            other => return Err(format!("unknown parameter {other:?} (by, since, class)")),
        }
    }
    if params.class.is_some() && params.by != GroupBy::Cause {
        return Err("class lists the causes of a class: leave by out (or by=cause)".into());
    }
    Ok(params)
}

/// This page's address for `params`.
pub(crate) fn url(params: &CausesParams) -> String {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    if params.by != GroupBy::Cause {
        pairs.push(("by", params.by.as_str()));
    }
    if params.since != "all" {
        pairs.push(("since", params.since));
    }
    if let Some(class) = &params.class {
        pairs.push(("class", class));
    }
    match serde_urlencoded::to_string(&pairs) {
        Ok(query) if !query.is_empty() => format!("/console/causes?{query}"),
        _ => "/console/causes".to_owned(),
    }
}

/// The causes of class `class`.
pub(crate) fn class_url(class: &str) -> String {
    url(&CausesParams {
        class: Some(class.to_owned()),
        ..CausesParams::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_query_reads_and_goes_back_into_the_same_address() {
        assert_eq!(parse(&[]).unwrap(), CausesParams::default());
        let params = parse(&pairs(&[("by", "handler"), ("since", "1d")])).unwrap();
        assert_eq!((params.by, params.since), (GroupBy::Handler, "1d"));
        assert_eq!(url(&params), "/console/causes?by=handler&since=1d");
        assert_eq!(
            parse(&pairs(&[("by", "handler"), ("since", "1d")])),
            Ok(params)
        );
        assert_eq!(url(&CausesParams::default()), "/console/causes");
        assert_eq!(class_url("a b&c"), "/console/causes?class=a+b%26c");
        let class = parse(&pairs(&[("class", "a b&c")])).unwrap();
        assert_eq!(class.class.as_deref(), Some("a b&c"));
        for (query, says) in [
            (vec![("by", "colour")], "colour"),
            (vec![("since", "2h")], "since"),
            (vec![("limit", "5")], "limit"),
            (vec![("by", "cause"), ("by", "class")], "once"),
            (vec![("by", "class"), ("class", "X")], "class"),
        ] {
            let error = parse(&pairs(&query)).unwrap_err();
            assert!(error.contains(says), "{query:?}: {error}");
        }
    }
}
