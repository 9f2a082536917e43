//! Who asks for an operation, and what they may do.

use super::error::{OperationError, Result};
use crate::config::Role;
use crate::store::Operator;

/// The one asking: an admin token's name and role, or the operator at a shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The audit log's actor: an admin token's name, `anonymous` on an open loopback
    /// API, or `cli:<user>@<host>`.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

impl Actor {
    /// The operator at this shell: `cli:<user>@<host>`, who may do anything the
    /// database lets them.
    pub fn shell() -> Actor {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_else(|_| "unknown".into());
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        Actor {
            name: format!("cli:{user}@{host}"),
            role: Role::Operate,
        }
    }

    /// Refuses an actor that may only read; every write verb asks this first.
    pub fn must_operate(&self) -> Result<()> {
        match self.role {
            Role::Operate => Ok(()),
            Role::Read => Err(OperationError::Forbidden(format!(
                "token {:?} may only read; this needs a token with role \"operate\"",
                self.name
            ))),
        }
    }

    /// This actor as the store's audited operator, with `reason`.
    pub(crate) fn operator(&self, reason: Option<String>) -> Operator {
        Operator {
            actor: self.name.clone(),
            reason,
        }
    }
}

/// Longest reason, in characters: a sentence or a ticket, not a document (each is
/// stored in the audit log and shown on its pages).
pub const MAX_REASON: usize = 2000;

/// `reason` trimmed, refused when absent or blank: the verbs that need a reason.
pub(crate) fn required_reason(reason: Option<&str>) -> Result<String> {
    optional_reason(reason)?.ok_or_else(|| {
        OperationError::bad_request("reason is required (it is written to the audit log)")
    })
}

/// `reason` trimmed, none when absent or blank; refused when too long or holding a NUL
/// character (PostgreSQL stores no NUL in text).
pub(crate) fn optional_reason(reason: Option<&str>) -> Result<Option<String>> {
    let Some(reason) = reason.map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    if reason.contains('\0') {
        return Err(OperationError::bad_request(
            "reason must not contain a NUL character",
        ));
    }
    let length = reason.chars().count();
    if length > MAX_REASON {
        return Err(OperationError::bad_request(format!(
            "reason is {length} characters long; at most {MAX_REASON}"
        )));
    }
    Ok(Some(reason.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_may_not_write_and_a_reason_is_never_blank() {
        let reader = Actor {
            name: "viewer".into(),
            role: Role::Read,
        };
        assert!(matches!(
            reader.must_operate(),
            Err(OperationError::Forbidden(text)) if text.contains("viewer")
        ));
        assert!(Actor::shell().must_operate().is_ok());
        assert!(Actor::shell().name.starts_with("cli:"));
        assert_eq!(required_reason(Some(" why ")).unwrap(), "why");
        for blank in [None, Some(""), Some("  ")] {
            assert!(required_reason(blank)
                .unwrap_err()
                .to_string()
                .contains("reason"));
            assert_eq!(optional_reason(blank).unwrap(), None);
        }
        let long = "x".repeat(MAX_REASON + 1);
        for (hostile, says) in [("a\0b", "NUL"), (long.as_str(), "at most 2000")] {
            for refused in [
                required_reason(Some(hostile)).map(Some),
                optional_reason(Some(hostile)),
            ] {
                let error = refused.unwrap_err().to_string();
                assert!(error.contains(says), "{error}");
            }
        }
        let longest = "é".repeat(MAX_REASON);
        assert_eq!(required_reason(Some(&longest)).unwrap(), longest);
    }
}
