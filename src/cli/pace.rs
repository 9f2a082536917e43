//! The pace options of `tasks retry` and `tasks replay` (see [`crate::pace`]).

use clap::Args;

use crate::pace::PaceRequest;

/// How a paced job ramps up and when it pauses itself.
#[derive(Debug, Args, Default)]
pub struct PaceArgs {
    /// Ramp up through these steps, as shares of --rate, with a checkpoint between two
    /// steps: `1%,5%,25%,100%`.
    #[arg(long)]
    pub ramp: Option<String>,
    /// Tasks per step before the last (default 100).
    #[arg(long)]
    pub step: Option<i64>,
    /// Pause when more than this share of a step's outcomes failed again (default 20%).
    #[arg(long)]
    pub pause_at: Option<String>,
    /// Outcomes a step needs before it is judged (default 50).
    #[arg(long)]
    pub min_outcomes: Option<i64>,
    /// How long a checkpoint waits for a step's outcomes (default 10s, at most 1h).
    #[arg(long)]
    pub settle: Option<String>,
}

impl PaceArgs {
    /// Whether any option of the pace was given.
    fn given(&self) -> bool {
        self.ramp.is_some()
            || self.step.is_some()
            || self.pause_at.is_some()
            || self.min_outcomes.is_some()
            || self.settle.is_some()
    }

    /// The pace at `rate`, when one is asked for: by any of these options, or with
    /// `rate_paces` by the rate alone (a retry).
    pub fn request(&self, rate: Option<f64>, rate_paces: bool) -> Option<PaceRequest> {
        (self.given() || rate_paces && rate.is_some()).then(|| PaceRequest {
            rate,
            ramp: self.ramp.clone(),
            step: self.step,
            pause_at: self.pause_at.clone(),
            min_outcomes: self.min_outcomes,
            settle: self.settle.clone(),
        })
    }
}
