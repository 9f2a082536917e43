//! Bearer tokens of the admin API: who calls, and what they may do.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use secrecy::ExposeSecret;
use std::sync::Arc;
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::config::{AdminSettings, Role};
use crate::operations::Actor;

/// The configured tokens, as bytes to compare.
pub struct Tokens {
    tokens: Vec<(String, Role, Vec<u8>)>,
}

impl Tokens {
    /// The tokens of `settings`.
    pub fn new(settings: &AdminSettings) -> Tokens {
        Tokens {
            tokens: settings
                .tokens
                .iter()
                .map(|(name, t)| {
                    (
                        name.clone(),
                        t.role,
                        t.token.expose_secret().as_bytes().to_vec(),
                    )
                })
                .collect(),
        }
    }

    /// Who presents `presented`. Every configured token is compared, each in constant
    /// time, so the time taken tells nothing about which bytes matched.
    pub fn identify(&self, presented: &[u8]) -> Option<Actor> {
        let mut found = None;
        for (name, role, token) in &self.tokens {
            // `ct_eq` on slices of different lengths is false without looking at bytes.
            if bool::from(token.as_slice().ct_eq(presented)) {
                found = Some(Actor {
                    name: name.clone(),
                    role: *role,
                });
            }
        }
        found
    }

    /// The caller named `name` and its token's bytes (the console's sessions are signed
    /// with a key derived from them).
    pub(crate) fn named(&self, name: &str) -> Option<(Actor, &[u8])> {
        self.tokens
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(n, role, token)| {
                let caller = Actor {
                    name: n.clone(),
                    role: *role,
                };
                (caller, token.as_slice())
            })
    }

    /// Whether no token is configured (an open API, allowed on loopback only).
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Middleware: sets the [`Actor`] of the request (the token's name and role), or
/// answers 401.
pub async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let caller = if tokens.is_open() {
        Actor {
            name: "anonymous".into(),
            role: Role::Operate,
        }
    } else {
        let presented = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()))
            .ok_or_else(|| {
                ApiError::unauthorized("missing bearer token (Authorization: Bearer <token>)")
            })?;
        tokens
            .identify(presented)
            .ok_or_else(|| ApiError::unauthorized("unknown bearer token"))?
    };
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// The token of an `Authorization` header's value in the `Bearer` scheme, whose name is
/// case-insensitive (RFC 9110, 11.1), after one or more spaces.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"Bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    Some(rest.trim_ascii_start())
}

/// Two tokens for unit tests: `ops` (operate) with the token `operate`, and `viewer`
/// (read) with `read-token-0123456789ab`.
#[cfg(test)]
pub(crate) fn test_tokens(operate: &str) -> Tokens {
    let mut settings = AdminSettings::default();
    for (name, role, token) in [
        ("ops", Role::Operate, operate),
        ("viewer", Role::Read, "read-token-0123456789ab"),
    ] {
        settings.tokens.insert(
            name.into(),
            crate::config::AdminToken {
                role,
                token: token.to_owned().into(),
            },
        );
    }
    Tokens::new(&settings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        test_tokens("operate-token-0123456789")
    }

    #[test]
    fn a_token_names_its_caller_and_anything_else_is_no_one() {
        let tokens = tokens();
        let caller = tokens.identify(b"read-token-0123456789ab").unwrap();
        assert_eq!((caller.name.as_str(), caller.role), ("viewer", Role::Read));
        assert_eq!(
            tokens.identify(b"operate-token-0123456789").unwrap().role,
            Role::Operate
        );
        for wrong in [
            &b""[..],
            b"read-token-0123456789a",
            b"read-token-0123456789abc",
            b"READ-TOKEN-0123456789AB",
        ] {
            assert_eq!(tokens.identify(wrong), None, "{wrong:?}");
        }
        assert!(caller.must_operate().is_err());
    }

    /// Found by an attack: `Authorization: bearer <token>` was refused as "missing bearer
    /// token"; the scheme's name is case-insensitive.
    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for value in [&b"Bearer t"[..], b"bearer t", b"BEARER t", b"Bearer   t"] {
            assert_eq!(bearer_token(value), Some(&b"t"[..]), "{value:?}");
        }
        for value in [&b"Bearert"[..], b"Basic t", b"Bear t", b"", b"Bearer"] {
            assert_eq!(bearer_token(value), None, "{value:?}");
        }
    }
}
