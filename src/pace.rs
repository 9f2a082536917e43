//! The pace of a redrive job (a paced retry or replay): a target rate, a ramp of steps
//! that start at a share of it, a checkpoint between steps, and the rule that pauses the
//! job when what it redrove fails again.
//!
//! A job runs step by step. Step `k` sends at `rate × ramp[k]`; every step but the last
//! covers `step_tasks` tasks, and the last runs to the end of the selection. Between two
//! steps the job waits `settle` for the step's outcomes, then judges them. During a step
//! it judges after every batch too, so a downstream that fails again is met within about
//! a batch (a second of sending) once `min_outcomes` outcomes are in.
//!
//! The judgement ([`Pace::judge`]): the job pauses when more than `pause_ratio` of the
//! step's outcomes (at least `min_outcomes` of them) are failures. The outcomes of a
//! retry are its tasks' attempts (resolved, or failed again) and the re-failures that
//! come back; those of a replay are the messages it produced and the re-failures that
//! come back through their dead-letter topic.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Most steps of a ramp.
pub const MOST_STEPS: usize = 20;
/// Tasks per step (every step but the last) unless the operator says otherwise.
pub const DEFAULT_STEP_TASKS: i64 = 100;
/// Most tasks per step.
pub const MOST_STEP_TASKS: i64 = 1_000_000;
/// Share of failed outcomes that pauses a job unless the operator says otherwise.
pub const DEFAULT_PAUSE_RATIO: f64 = 0.2;
/// Outcomes a step needs before it is judged, unless the operator says otherwise.
pub const DEFAULT_MIN_OUTCOMES: i64 = 50;
/// How long a checkpoint waits for a step's outcomes unless the operator says otherwise.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(10);
/// Longest settle an operator may ask for.
pub const LONGEST_SETTLE: Duration = Duration::from_secs(3600);

/// The pace as an operator writes it: the `pace` of a retry or replay request, and the
/// CLI's `--rate`, `--ramp`, `--step`, `--pause-at`, `--min-outcomes` and `--settle`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PaceRequest {
    /// Tasks (a retry) or messages (a replay) per second at full pace.
    pub rate: Option<f64>,
    /// The steps, as shares of the rate: `1%,5%,25%,100%` (default: one step, `100%`).
    pub ramp: Option<String>,
    /// Tasks per step before the last (default 100).
    pub step: Option<i64>,
    /// Pause when more than this share of a step's outcomes failed: `20%` (default) or
    /// `0.2`.
    pub pause_at: Option<String>,
    /// Outcomes a step needs before it is judged (default 50).
    pub min_outcomes: Option<i64>,
    /// How long a checkpoint waits for a step's outcomes: `10s` (default), at most `1h`.
    pub settle: Option<String>,
}

impl PaceRequest {
    /// Whether any of it was given (a face that builds one from options it may not
    /// have).
    pub fn is_given(&self) -> bool {
        self.rate.is_some()
            || self.ramp.is_some()
            || self.step.is_some()
            || self.pause_at.is_some()
            || self.min_outcomes.is_some()
            || self.settle.is_some()
    }
}

/// A validated pace, as a job keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Pace {
    /// Per second at full pace.
    pub rate: f64,
    /// The steps' shares of `rate`, each above 0 and at most 1.
    pub ramp: Vec<f64>,
    /// Tasks per step before the last.
    pub step_tasks: i64,
    /// Share of failed outcomes above which the job pauses.
    pub pause_ratio: f64,
    /// Outcomes a step needs before it is judged.
    pub min_outcomes: i64,
    /// Milliseconds a checkpoint waits for a step's outcomes.
    pub settle_ms: u64,
}

/// A step's outcomes so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Outcomes {
    /// Outcomes counted (succeeded or failed).
    pub total: i64,
    /// Of which failures.
    pub failed: i64,
    /// The causes of the failures, most frequent first (a few).
    pub causes: Vec<String>,
}

impl Pace {
    /// The pace `request` asks for, or why it is refused (naming the field).
    pub fn from_request(request: &PaceRequest) -> Result<Pace, String> {
        let rate = request
            .rate
            .ok_or("rate: a paced job needs a rate (per second at full pace)")?;
        if let Some(refusal) = crate::rate::refusal(rate) {
            return Err(format!("rate {refusal}"));
        }
        let ramp = match &request.ramp {
            None => vec![1.0],
            Some(text) => parse_ramp(text).map_err(|why| format!("ramp: {why}"))?,
        };
        let step_tasks = request.step.unwrap_or(DEFAULT_STEP_TASKS);
        if !(1..=MOST_STEP_TASKS).contains(&step_tasks) {
            return Err(format!(
                "step: must be from 1 to {MOST_STEP_TASKS} tasks, got {step_tasks}"
            ));
        }
        let pause_ratio = match &request.pause_at {
            None => DEFAULT_PAUSE_RATIO,
            Some(text) => parse_share(text).map_err(|why| format!("pause_at: {why}"))?,
        };
        let min_outcomes = request.min_outcomes.unwrap_or(DEFAULT_MIN_OUTCOMES);
        if !(1..=MOST_STEP_TASKS).contains(&min_outcomes) {
            return Err(format!(
                "min_outcomes: must be from 1 to {MOST_STEP_TASKS}, got {min_outcomes}"
            ));
        }
        let settle = match &request.settle {
            None => DEFAULT_SETTLE,
            Some(text) => humantime::parse_duration(text.trim())
                .map_err(|e| format!("settle: {e} (write it like `10s` or `2m`)"))?,
        };
        if settle > LONGEST_SETTLE {
            return Err(format!(
                "settle: at most {}, got {}",
                humantime::format_duration(LONGEST_SETTLE),
                humantime::format_duration(settle)
            ));
        }
        for (n, share) in ramp.iter().enumerate() {
            if rate * share < crate::rate::MIN_RATE {
                return Err(format!(
                    "ramp: step {}: {}% of {rate}/s is below the least rate, {}/s",
                    n + 1,
                    share * 100.0,
                    crate::rate::MIN_RATE
                ));
            }
        }
        if ramp.len() > 1 && step_tasks < min_outcomes {
            return Err(format!(
                "step: a step of {step_tasks} tasks never gathers the {min_outcomes} outcomes \
                 a checkpoint judges (min_outcomes); raise step or lower min_outcomes"
            ));
        }
        Ok(Pace {
            rate,
            ramp,
            step_tasks,
            pause_ratio,
            min_outcomes,
            settle_ms: u64::try_from(settle.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// How many steps it has (at least one).
    pub fn steps(&self) -> usize {
        self.ramp.len().max(1)
    }

    /// Whether `step` is the last (it runs to the end of the selection).
    pub fn is_last(&self, step: i32) -> bool {
        step_index(step) + 1 >= self.steps()
    }

    /// The rate of `step` (the last step's beyond the ramp): always a rate a limiter
    /// takes, even from a row written by hand.
    pub fn rate_of(&self, step: i32) -> f64 {
        let share = self
            .ramp
            .get(step_index(step))
            .or(self.ramp.last())
            .copied()
            .unwrap_or(1.0);
        let rate = self.rate * share;
        if rate.is_finite() {
            rate.clamp(crate::rate::MIN_RATE, crate::rate::MAX_RATE)
        } else {
            crate::rate::MIN_RATE
        }
    }

    /// How long a checkpoint waits.
    pub fn settle(&self) -> Duration {
        Duration::from_millis(self.settle_ms).min(LONGEST_SETTLE)
    }

    /// Why the job must pause, given `step`'s `outcomes`; none when it may go on.
    pub fn judge(&self, step: i32, outcomes: &Outcomes) -> Option<String> {
        if outcomes.total < self.min_outcomes.max(1) || outcomes.total <= 0 {
            return None;
        }
        let ratio = outcomes.failed as f64 / outcomes.total as f64;
        if ratio <= self.pause_ratio {
            return None;
        }
        let causes = match outcomes.causes.as_slice() {
            [] => String::new(),
            causes => format!("; causes: {}", causes.join("; ")),
        };
        Some(format!(
            "{} of {} outcomes of step {} of {} failed ({:.0}%, above {:.0}%){causes}",
            outcomes.failed,
            outcomes.total,
            step_index(step) + 1,
            self.steps(),
            ratio * 100.0,
            self.pause_ratio * 100.0,
        ))
    }

    /// The same pace at `rate` (an operator slowing a paused job down).
    pub fn at_rate(&self, rate: f64) -> Result<Pace, String> {
        if let Some(refusal) = crate::rate::refusal(rate) {
            return Err(format!("rate {refusal}"));
        }
        Ok(Pace {
            rate,
            ..self.clone()
        })
    }

    /// The ramp as written: `1%,5%,100%`.
    pub fn ramp_text(&self) -> String {
        let shares: Vec<String> = self
            .ramp
            .iter()
            .map(|share| format!("{}%", trim_number(share * 100.0)))
            .collect();
        shares.join(",")
    }
}

fn step_index(step: i32) -> usize {
    usize::try_from(step).unwrap_or(0)
}

fn trim_number(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// `1%,5%,25%,100%` (or shares: `0.01,0.05,1`) into shares of the rate.
fn parse_ramp(text: &str) -> Result<Vec<f64>, String> {
    let steps: Vec<&str> = text.split(',').map(str::trim).collect();
    if steps.len() > MOST_STEPS {
        return Err(format!("at most {MOST_STEPS} steps, got {}", steps.len()));
    }
    steps
        .iter()
        .enumerate()
        .map(|(n, step)| parse_share(step).map_err(|why| format!("step {}: {why}", n + 1)))
        .collect()
}

/// `20%` or `0.2` into a share above 0 and at most 1.
fn parse_share(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let (number, scale) = match text.strip_suffix('%') {
        Some(percent) => (percent.trim(), 100.0),
        None => (text, 1.0),
    };
    let share = number
        .parse::<f64>()
        .map(|n| n / scale)
        .map_err(|_| format!("{text:?} is not a share (write it like `20%` or `0.2`)"))?;
    if !(share > 0.0 && share <= 1.0) {
        return Err(format!("{text:?} must be above 0% and at most 100%"));
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rate: f64) -> PaceRequest {
        PaceRequest {
            rate: Some(rate),
            ..PaceRequest::default()
        }
    }

    #[test]
    fn a_ramp_is_read_as_shares_and_its_steps_run_at_their_share_of_the_rate() {
        let pace = Pace::from_request(&PaceRequest {
            ramp: Some("1%, 5%,25%,100%".into()),
            ..request(200.0)
        })
        .expect("a valid pace");
        assert_eq!(pace.ramp, vec![0.01, 0.05, 0.25, 1.0]);
        assert_eq!(pace.steps(), 4);
        assert!((pace.rate_of(0) - 2.0).abs() < 1e-9);
        assert!((pace.rate_of(3) - 200.0).abs() < 1e-9);
        assert!(
            (pace.rate_of(9) - 200.0).abs() < 1e-9,
            "past the ramp: its last"
        );
        assert!((pace.rate_of(-4) - 2.0).abs() < 1e-9, "a hand-written step");
        assert!(!pace.is_last(2));
        assert!(pace.is_last(3));
        assert_eq!(pace.ramp_text(), "1%,5%,25%,100%");
        assert_eq!(pace.step_tasks, DEFAULT_STEP_TASKS);
        assert_eq!(pace.settle(), DEFAULT_SETTLE);
        let shares = Pace::from_request(&PaceRequest {
            ramp: Some("0.5,1".into()),
            ..request(10.0)
        })
        .expect("shares");
        assert_eq!(shares.ramp, vec![0.5, 1.0]);
    }

    #[test]
    fn every_bad_value_is_refused_naming_its_field() {
        let cases: Vec<(PaceRequest, &str)> = vec![
            (PaceRequest::default(), "rate:"),
            (request(0.0), "rate must be"),
            (request(f64::NAN), "rate must be"),
            (request(1e-20), "rate must be"),
            (request(f64::INFINITY), "rate must be"),
            (
                PaceRequest {
                    ramp: Some("1%,,100%".into()),
                    ..request(1.0)
                },
                "ramp: step 2",
            ),
            (
                PaceRequest {
                    ramp: Some("0%,100%".into()),
                    ..request(1.0)
                },
                "ramp: step 1",
            ),
            (
                PaceRequest {
                    ramp: Some("150%".into()),
                    ..request(1.0)
                },
                "ramp: step 1",
            ),
            (
                PaceRequest {
                    ramp: Some("NaN%".into()),
                    ..request(1.0)
                },
                "ramp: step 1",
            ),
            (
                PaceRequest {
                    ramp: Some(vec!["1%"; 21].join(",")),
                    ..request(1.0)
                },
                "ramp: at most 20",
            ),
            (
                PaceRequest {
                    step: Some(0),
                    ..request(1.0)
                },
                "step:",
            ),
            (
                PaceRequest {
                    step: Some(i64::MAX),
                    ..request(1.0)
                },
                "step:",
            ),
            (
                PaceRequest {
                    pause_at: Some("1e-400".into()),
                    ..request(1.0)
                },
                "pause_at:",
            ),
            (
                PaceRequest {
                    pause_at: Some("-20%".into()),
                    ..request(1.0)
                },
                "pause_at:",
            ),
            (
                PaceRequest {
                    min_outcomes: Some(-1),
                    ..request(1.0)
                },
                "min_outcomes:",
            ),
            (
                PaceRequest {
                    settle: Some("soon".into()),
                    ..request(1.0)
                },
                "settle:",
            ),
            (
                PaceRequest {
                    settle: Some("2h".into()),
                    ..request(1.0)
                },
                "settle: at most",
            ),
        ];
        for (request, expected) in cases {
            let refused = Pace::from_request(&request).expect_err("refused");
            assert!(
                refused.starts_with(expected),
                "{request:?}: {refused:?} should start with {expected:?}"
            );
        }
    }

    #[test]
    fn a_step_pauses_only_past_the_ratio_with_enough_outcomes() {
        let pace = Pace::from_request(&PaceRequest {
            ramp: Some("10%,100%".into()),
            ..request(100.0)
        })
        .expect("a pace");
        let outcomes = |total, failed| Outcomes {
            total,
            failed,
            causes: vec!["http.5xx: HTTP 503".into()],
        };
        assert_eq!(pace.judge(0, &outcomes(49, 49)), None, "too few outcomes");
        assert_eq!(
            pace.judge(0, &outcomes(50, 10)),
            None,
            "20% is not above 20%"
        );
        let reason = pace.judge(0, &outcomes(50, 11)).expect("paused");
        assert_eq!(
            reason,
            "11 of 50 outcomes of step 1 of 2 failed (22%, above 20%); causes: http.5xx: HTTP 503"
        );
        assert_eq!(pace.judge(1, &outcomes(0, 0)), None);
        assert!(pace.judge(1, &outcomes(60, 60)).is_some());
        // A row written by hand with no minimum still needs one outcome.
        let careless = Pace {
            min_outcomes: 0,
            ..pace
        };
        assert_eq!(careless.judge(0, &outcomes(0, 0)), None);
    }

    #[test]
    fn a_paused_job_is_slowed_down_to_a_valid_rate_only() {
        let pace = Pace::from_request(&request(100.0)).expect("a pace");
        assert_eq!(pace.at_rate(5.0).expect("slower").rate, 5.0);
        assert!(pace.at_rate(-1.0).is_err());
        assert!(pace.at_rate(f64::NAN).is_err());
        let hand_written = Pace {
            rate: f64::INFINITY,
            ..pace
        };
        assert_eq!(hand_written.rate_of(0), crate::rate::MIN_RATE);
    }
}
