//! What may be shown of a URL: everything but its credentials.
//!
//! Userinfo (`user:password@`) becomes `***@`; each query value becomes `***` (a name
//! stays, so `?api_key=***` still tells what was sent; a bare `?token` is all value);
//! a fragment becomes `#***`. Scheme, host, port and path stay: a secret belongs in the
//! userinfo, the query or a header, not in the path.

use reqwest::Url;

use super::checks::percent_decode;

/// Stands in for a credential.
const HIDDEN: &str = "***";

/// Shortest credential scrubbed from free text: shorter values (`v=1`) would only
/// mangle the text they are common in.
const MIN_SCRUBBED: usize = 4;

/// `url` with its credentials replaced by `***`.
pub fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if !url.username().is_empty() || url.password().is_some() {
        // Only URLs that can have userinfo have it, so these cannot fail.
        let _ = shown.set_password(None);
        let _ = shown.set_username(HIDDEN);
    }
    if let Some(query) = url.query() {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}={HIDDEN}"),
                None if pair.is_empty() => String::new(),
                None => HIDDEN.to_owned(),
            })
            .collect();
        shown.set_query(Some(&pairs.join("&")));
    }
    if url.fragment().is_some() {
        shown.set_fragment(Some(HIDDEN));
    }
    shown.into()
}

/// [`redacted`] for a URL as written, which may not parse (then nothing of it is shown).
pub fn redacted_text(text: &str) -> String {
    Url::parse(text).map_or_else(|_| "(not a URL)".to_owned(), |url| redacted(&url))
}

/// `text` (an answer of the server at `url`, which may echo the request) with the
/// credentials of `url` replaced by `***`, as written and percent-decoded.
pub fn scrub(text: &str, url: &Url) -> String {
    let query = url.query().unwrap_or_default().split('&');
    let values = query.map(|pair| pair.split_once('=').map_or(pair, |(_, v)| v));
    // A user name is a credential when it stands alone (`https://TOKEN@host`).
    let userinfo = url.password().unwrap_or(url.username());
    let credentials = std::iter::once(userinfo)
        .chain(values)
        .chain(url.fragment());
    let mut secrets: Vec<String> = credentials
        .flat_map(|raw| [raw.to_owned(), percent_decode(raw)])
        .filter(|secret| secret.len() >= MIN_SCRUBBED)
        .collect();
    // Longest first, so that a secret holding another is replaced whole.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    secrets
        .iter()
        .fold(text.to_owned(), |text, secret| text.replace(secret, HIDDEN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_values_and_fragments_are_hidden() {
        let url = |text: &str| redacted(&Url::parse(text).unwrap());
        assert_eq!(
            url("https://user:pa%40ss@hooks.example:8443/in/v1?api_key=k3y&v=1&flag#frag"),
            "https://***@hooks.example:8443/in/v1?api_key=***&v=***&***#***"
        );
        assert_eq!(url("https://token@h/"), "https://***@h/");
        assert_eq!(url("http://h:8080/a?"), "http://h:8080/a?");
        assert_eq!(url("http://h/plain"), "http://h/plain");
        assert_eq!(redacted_text("http//u:pass@h"), "(not a URL)");
    }

    #[test]
    fn an_echoed_credential_is_scrubbed_as_written_and_decoded() {
        let url = Url::parse("https://user:pa%40ss-w0rd@h/?api_key=k3y+value&v=1").unwrap();
        assert_eq!(
            scrub("user pa@ss-w0rd k3y value; api_key=k3y+value&v=1", &url),
            "user *** ***; api_key=***&v=1"
        );
        let url = Url::parse("https://t0ken-abc@h/").unwrap();
        assert_eq!(scrub("who is t0ken-abc?", &url), "who is ***?");
    }
}
