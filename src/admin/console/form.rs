//! The console's action form: what the task list's and a task page's action forms post
//! (the verb, the ticked ids or the list's filter, the reason and the verb's options),
//! read, and turned into the operations layer's requests.

use super::error::PageError;
use super::filter;
use crate::operations::{ActRequest, FilterParams, ReplayRequest, Verb};
use crate::pace::PaceRequest;
use crate::store::CauseView;

/// The verbs offered on the list and a task's page: value and label.
pub(crate) const VERBS: [(&str, &str); 4] = [
    ("retry", "Retry"),
    ("discard", "Discard"),
    ("resolve", "Resolve"),
    ("replay", "Replay"),
];

/// What the operator asks for: a verb, or a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// Retry, discard or resolve.
    Act(Verb),
    /// Replay (the ticked tasks, or what the filter selects).
    Replay,
}

/// An action form, read.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActionForm {
    /// The verb, as posted (`retry`, `discard`, `resolve`, `replay`).
    pub verb: String,
    /// The ticked tasks.
    pub ids: Vec<i64>,
    /// Every task the filter selects, rather than the ticked ones.
    pub by_filter: bool,
    /// The list's filter, as its query string.
    pub filter: String,
    /// Why.
    pub reason: Option<String>,
    /// Retry: when.
    pub at: Option<String>,
    /// Retry: more attempts.
    pub more_attempts: Option<String>,
    /// Replay: the target topic (empty: each task's original one).
    pub to: Option<String>,
    /// Replay: messages per second at most; retry: a paced retry's tasks per second.
    pub rate: Option<String>,
    /// Retry and replay: the ramp of a paced job (`1%,5%,100%` of the rate).
    pub ramp: Option<String>,
    /// Replay: mark each replayed task resolved.
    pub mark_resolved: bool,
}

impl ActionForm {
    /// The form with its filter held to the tasks stored by `now`, unless it gives an
    /// end of its own: the confirm page counts what exists, and a cause that keeps
    /// growing during an incident must not add tasks the operator never saw to what
    /// they confirm.
    pub(crate) fn pinned(mut self, now: chrono::DateTime<chrono::Utc>) -> ActionForm {
        if !self.by_filter {
            return self;
        }
        let mut pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(&self.filter).unwrap_or_default();
        if !pairs.iter().any(|(name, _)| name == "created_before") {
            pairs.push((
                "created_before".into(),
                now.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            ));
            self.filter = serde_urlencoded::to_string(&pairs).unwrap_or(self.filter);
        }
        self
    }

    /// Reads the posted fields; an unknown or repeated field is refused.
    pub(crate) fn read(pairs: Vec<(String, String)>) -> Result<ActionForm, PageError> {
        let mut form = ActionForm::default();
        let mut seen = std::collections::HashSet::new();
        for (name, value) in pairs {
            if name != "id" && !seen.insert(name.clone()) {
                return Err(PageError::bad_request(format!("give {name} once")));
            }
            let given = (!value.trim().is_empty()).then(|| value.trim().to_owned());
            match name.as_str() {
                "verb" => form.verb = value,
                "id" => {
                    form.ids.push(value.trim().parse().map_err(|_| {
                        PageError::bad_request(format!("{value:?} is not a task id"))
                    })?)
                }
                "scope" => form.by_filter = value == "filter",
                "filter" => form.filter = value,
                "reason" => form.reason = given,
                "at" => form.at = given,
                "more_attempts" => form.more_attempts = given,
                "to" => form.to = given,
                "rate" => form.rate = given,
                "ramp" => form.ramp = given,
                "mark_resolved" => form.mark_resolved = true,
                other => return Err(PageError::bad_request(format!("unknown field {other:?}"))),
            }
        }
        Ok(form)
    }

    /// The verb asked for.
    pub(crate) fn asked(&self) -> Result<Asked, PageError> {
        Ok(match self.verb.as_str() {
            "retry" => Asked::Act(Verb::Retry),
            "discard" => Asked::Act(Verb::Discard),
            "resolve" => Asked::Act(Verb::Resolve),
            "replay" => Asked::Replay,
            other => return Err(PageError::bad_request(format!("no action {other:?}"))),
        })
    }

    /// The list's filter, read as the list reads it, for the layer.
    pub(crate) fn filter(&self) -> Result<FilterParams, PageError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(&self.filter)
            .map_err(|e| PageError::bad_request(format!("filter: {e}")))?;
        let pairs: Vec<_> = (pairs.into_iter())
            .filter(|(name, _)| name != "limit" && name != "after")
            .collect();
        let list = filter::parse(&pairs, chrono::Utc::now()).map_err(PageError::bad_request)?;
        Ok(filter::params(&list.filter))
    }

    /// The selection in words.
    pub(crate) fn describe(&self) -> Result<String, PageError> {
        Ok(match self.by_filter {
            true => {
                let list = filter::parse(
                    &serde_urlencoded::from_str::<Vec<(String, String)>>(&self.filter)
                        .unwrap_or_default(),
                    chrono::Utc::now(),
                );
                let words =
                    list.map_or_else(|_| "the filter".into(), |l| filter::describe(&l.filter));
                format!("the tasks that match: {words}")
            }
            false if self.ids.len() == 1 => format!("task {}", self.ids[0]),
            false => format!("{} ticked tasks", self.ids.len()),
        })
    }

    /// The cause a selection by filter names, as stored: the confirm page says what it
    /// is, not only its id.
    pub(crate) async fn cause(&self, store: &crate::store::Store) -> Option<CauseView> {
        if !self.by_filter {
            return None;
        }
        let pairs = serde_urlencoded::from_str::<Vec<(String, String)>>(&self.filter).ok()?;
        let list = filter::parse(&pairs, chrono::Utc::now()).ok()?;
        store.cause(list.filter.cause?).await.ok().flatten()
    }

    /// The layer's request for a retry, discard or resolve.
    pub(crate) fn act_request(&self, dry_run: bool) -> Result<ActRequest, PageError> {
        let (ids, filter, all) = self.selection()?;
        let more_attempts = (self.more_attempts.as_deref())
            .map(|n| n.parse::<i32>())
            .transpose()
            .map_err(|_| PageError::bad_request("more attempts must be a whole number"))?;
        Ok(ActRequest {
            ids,
            filter,
            all,
            reason: self.reason.clone(),
            dry_run,
            at: self.at.clone(),
            more_attempts,
            force: false,
            pace: self.pace(self.rate()?, true),
        })
    }

    /// The layer's request for a replay.
    pub(crate) fn replay_request(&self, dry_run: bool) -> Result<ReplayRequest, PageError> {
        let (ids, filter, all) = self.selection()?;
        let rate = self.rate()?;
        let pace = self.pace(rate, false);
        Ok(ReplayRequest {
            ids,
            filter,
            all,
            to: self.to.clone(),
            mark_resolved: self.mark_resolved,
            rate: if pace.is_some() { None } else { rate },
            pace,
            force: false,
            reason: self.reason.clone(),
            dry_run,
        })
    }

    /// The rate given, as a number.
    fn rate(&self) -> Result<Option<f64>, PageError> {
        (self.rate.as_deref())
            .map(|r| r.parse::<f64>())
            .transpose()
            .map_err(|_| PageError::bad_request("rate must be a number a second"))
    }

    /// The pace asked for: a ramp (with the rate), or with `rate_paces` the rate alone
    /// (a retry).
    fn pace(&self, rate: Option<f64>, rate_paces: bool) -> Option<PaceRequest> {
        (self.ramp.is_some() || rate_paces && rate.is_some()).then(|| PaceRequest {
            rate,
            ramp: self.ramp.clone(),
            ..PaceRequest::default()
        })
    }

    /// The ids, or the filter (every task only when the filter is empty).
    fn selection(&self) -> Result<(Vec<i64>, Option<FilterParams>, bool), PageError> {
        match self.by_filter {
            true => {
                let filter = self.filter()?;
                let all = filter.is_empty();
                Ok((Vec::new(), Some(filter), all))
            }
            false if self.ids.is_empty() => Err(PageError::bad_request(
                "no task selected: tick some, or \"select all that match this filter\"",
            )),
            false => Ok((self.ids.clone(), None, false)),
        }
    }
}
