//! A [`WaitingState`] in words, for the headline of `tasks show`.

use chrono::{DateTime, Utc};

use super::{CompensationNow, Ending, WaitingState};
use crate::when::{at, at_from_now, from_now, span};

/// `state` as a sentence; `handler` and `key` (one line) name what it waits on, `now`
/// is the database's clock. What others wrote into it (an operator's reason, a
/// downstream's error, a member's name) has its invisible and control characters shown
/// as escapes, so a reason can neither move the text around it nor drive a terminal.
pub(super) fn say(
    state: &WaitingState,
    handler: &str,
    key: Option<&str>,
    now: DateTime<Utc>,
) -> String {
    crate::readable::visible(&sentence(state, handler, key, now)).into_owned()
}

fn sentence(state: &WaitingState, handler: &str, key: Option<&str>, now: DateTime<Utc>) -> String {
    let when = |time: DateTime<Utc>| at_from_now(time, now);
    match state {
        WaitingState::Running {
            member,
            attempt,
            since,
            lease_until,
        } => {
            let since = since.map_or(String::new(), |s| format!(" since {}", when(s)));
            format!(
                "running: attempt {attempt} on member {member}{since}; its lease runs until {}",
                when(*lease_until)
            )
        }
        WaitingState::LeaseLapsed {
            member,
            attempt,
            lapsed_at,
        } => format!(
            "attempt {attempt} on member {member} lost its lease at {} (the member stopped \
             renewing it): the next claim takes the task over",
            when(*lapsed_at)
        ),
        WaitingState::Stopping { task, ends_by } => format!(
            "waits for a call of task {task}, fenced out by an operator, to stop (by {}): \
             nothing of its key starts before",
            when(*ends_by)
        ),
        WaitingState::Held { behind, ahead } => {
            let key = key.map_or("its key".to_owned(), |k| format!("its key \"{k}\""));
            let first = match behind {
                Some(task) => format!("held behind task {task} of {key}"),
                None => format!("held behind the open tasks of {key}"),
            };
            match ahead {
                n if *n > 1 => format!("{first} ({n} open tasks of the key go first)"),
                _ => first,
            }
        }
        WaitingState::BreakerOpen {
            handler,
            breaker,
            forced,
            until,
            reason,
        } => {
            let until = until.map_or("its release".to_owned(), when);
            if *forced {
                // Who forced it and why: "forced open by ACTOR: REASON", as the store
                // records the command.
                let why = match reason.as_deref() {
                    Some(r) if r.starts_with("forced open") => r.to_owned(),
                    Some(r) => format!("forced open ({r})"),
                    None => "forced open".to_owned(),
                };
                return format!(
                    "the breaker of `{handler}` is {why}; its tasks wait until it is \
                     released (`redrive breakers release {handler}`)"
                );
            }
            let reason = reason
                .as_deref()
                .map_or(String::new(), |r| format!(": {r}"));
            match breaker.as_str() {
                "half_open" => format!(
                    "the breaker of `{handler}` is half-open{reason}: a few probe tasks run, \
                     the others wait until {until}"
                ),
                _ => format!("the breaker of `{handler}` is open until {until}{reason}"),
            }
        }
        WaitingState::Due {
            at: due,
            serving_members,
        } => {
            let due_words = match (*due - now).num_seconds() {
                s if s > 0 => format!("due in {} (at {})", span(s), at(*due)),
                s if s <= -1 => format!(
                    "due now (for {}), waiting for a worker of `{handler}`",
                    span(-s)
                ),
                _ => format!("due now, waiting for a worker of `{handler}`"),
            };
            match serving_members {
                0 => format!("{due_words}; no live member serves handler `{handler}`"),
                _ => due_words,
            }
        }
        WaitingState::NoAttemptsLeft {
            used,
            allowed,
            due_at,
        } => {
            let due = match *due_at > now {
                true => format!("due {}", from_now(*due_at, now)),
                false => "due now".to_owned(),
            };
            format!(
                "no attempts left ({used} of {allowed} used): its next claim ({due}) ends it \
                 as a permanent failure without calling the handler"
            )
        }
        WaitingState::Finished {
            status,
            at: finished,
            ending,
            compensation,
        } => {
            let mut text = match ending {
                Some(ending) => ended(ending),
                None => status.to_string(),
            };
            if let Some(finished) = finished {
                text.push_str(&format!(" at {}", when(*finished)));
            }
            if let Some(compensation) = compensation {
                text.push_str("; ");
                text.push_str(&compensating(compensation, now));
            }
            text
        }
    }
}

/// How the row that ended a task ended it.
fn ended(ending: &Ending) -> String {
    let Ending {
        outcome,
        by,
        attempt,
        note,
    } = ending;
    let because = note.as_deref().map_or(String::new(), |n| format!(" ({n})"));
    match outcome.as_str() {
        "resolved" => format!("resolved by its handler on attempt {attempt} (member {by})"),
        "operator_resolve" => format!("resolved by {by}{because}"),
        "operator_discard" => format!("discarded by {by}{because}"),
        "not_called" => format!(
            "ended a permanent failure without a call: attempt {attempt} was past its \
             budget (earlier attempts lost their leases)"
        ),
        _ => format!("ended a permanent failure on attempt {attempt} (member {by})"),
    }
}

fn compensating(compensation: &CompensationNow, now: DateTime<Utc>) -> String {
    let when = |time: &Option<DateTime<Utc>>| {
        time.map_or(String::new(), |t| format!(" at {}", at_from_now(t, now)))
    };
    match compensation {
        CompensationNow::Owed {
            due_at,
            attempts_made,
        } => {
            let due = match *due_at > now {
                true => format!("due {}", at_from_now(*due_at, now)),
                false => "due now".to_owned(),
            };
            match attempts_made {
                0 => format!("compensation owed, {due}"),
                n => format!("compensation owed, {due}, after {n} failed attempt(s)"),
            }
        }
        CompensationNow::Running {
            attempt,
            claim_until,
        } if *claim_until > now => format!(
            "compensation running (attempt {attempt}, its claim runs until {})",
            at_from_now(*claim_until, now)
        ),
        CompensationNow::Running {
            attempt,
            claim_until,
        } => format!(
            "compensation attempt {attempt} lost its claim at {}: due again",
            at_from_now(*claim_until, now)
        ),
        CompensationNow::Compensated { at } => format!("compensated{}", when(at)),
        CompensationNow::Failed { at, error } => format!(
            "compensation failed{}{}",
            when(at),
            error.as_deref().map_or(String::new(), |e| format!(": {e}"))
        ),
        CompensationNow::Cancelled { at } => format!("compensation cancelled{}", when(at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::Status;

    /// Found by the third issue 16 attack: a reason's escape sequence cleared the
    /// operator's terminal in `tasks show`, and a right-to-left override turned the
    /// console's "Ended" line around, its time included.
    #[test]
    fn an_operators_reason_is_shown_with_its_hidden_characters_escaped() {
        let now = Utc::now();
        let state = WaitingState::Finished {
            status: Status::Discarded,
            at: Some(now),
            ending: Some(Ending {
                outcome: "operator_discard".into(),
                by: "cli:op\u{7}".into(),
                attempt: 1,
                note: Some("evil\u{1b}[2J\u{202E} RTL".into()),
            }),
            compensation: None,
        };
        let said = say(&state, "billing", None, now);
        assert!(!said.chars().any(crate::readable::hidden), "{said:?}");
        assert!(said.contains("evil\\u{001B}[2J\\u{202E} RTL"), "{said}");
        assert!(said.contains("cli:op\\u{0007}"), "{said}");
    }
}
