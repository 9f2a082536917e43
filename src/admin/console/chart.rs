//! The overview's chart of the last hour's attempt outcomes, one stacked bar a minute,
//! as inline SVG: no chart library, no script, colours from the stylesheet (classes,
//! not style attributes). Each bar has a `<title>` with its figures, and the outcome
//! table beside the chart carries the same figures as text.

use maud::{html, Markup};
use std::collections::BTreeMap;

use crate::store::OutcomeMinute;

const MINUTES: i32 = 60;
const SLOT: i64 = 10;
const PLOT_TOP: i64 = 14;
const PLOT_HEIGHT: i64 = 100;
/// Stacking order, bottom up.
const CLASSES: [&str; 4] = ["ok", "retry", "failed", "other"];
/// The legend: each class's colour and the outcomes it stands for.
const LEGEND: [(&str, &str); 4] = [
    ("ok", "resolved"),
    ("retry", "retry, lease expired, released"),
    ("failed", "permanent failure"),
    ("other", "other"),
];

/// The chart and badge colour of an attempt outcome.
pub(crate) fn outcome_class(outcome: &str) -> &'static str {
    match outcome {
        "resolved" => "ok",
        "retry" | "lease_expired" | "released" => "retry",
        "permanent_failure" => "failed",
        _ => "other",
    }
}

/// The chart of `minutes` (as [`crate::store::Store::outcome_minutes`] reads them).
pub(crate) fn outcomes(minutes: &[OutcomeMinute]) -> Markup {
    // minutes_ago → class → count, and every outcome for the tooltip.
    let mut bars: BTreeMap<i32, (BTreeMap<&str, i64>, Vec<String>)> = BTreeMap::new();
    for m in minutes
        .iter()
        .filter(|m| (0..MINUTES).contains(&m.minutes_ago))
    {
        let (classes, said) = bars.entry(m.minutes_ago).or_default();
        *classes.entry(outcome_class(&m.outcome)).or_default() += m.count;
        said.push(format!(
            "{} {}",
            super::layout::thousands(m.count),
            m.outcome
        ));
    }
    let highest = bars
        .values()
        .map(|(classes, _)| classes.values().sum::<i64>())
        .max()
        .unwrap_or(0);
    if highest == 0 {
        return html! { p.empty { "No attempts in the last hour." } };
    }
    let width = SLOT * i64::from(MINUTES);
    html! {
        figure.chart-box {
        svg.chart viewBox={ "0 0 " (width) " " (PLOT_TOP + PLOT_HEIGHT + 16) }
            role="img" aria-label="Attempt outcomes per minute over the last hour" {
            text.axis x="0" y="10" { "peak " (super::layout::thousands(highest)) " a minute" }
            @for (ago, (classes, said)) in &bars {
                @let x = (i64::from(MINUTES - 1 - ago)) * SLOT;
                g {
                    title {
                        @if *ago == 0 { "this minute" } @else { (ago) " min ago" }
                        ": " (said.join(", "))
                    }
                    @for (class, top, height) in stack(classes, highest) {
                        rect class={ "bar " (class) } x=(x + 1) y=(top) width=(SLOT - 2) height=(height) {}
                    }
                }
            }
            text.axis x="0" y=(PLOT_TOP + PLOT_HEIGHT + 14) { "60 min ago" }
            text.axis.end x=(width) y=(PLOT_TOP + PLOT_HEIGHT + 14) { "now" }
        }
        figcaption {
            ul.legend aria-label="Colours" {
                @for (class, said) in LEGEND {
                    li { span class={ "swatch " (class) } aria-hidden="true" {} (said) }
                }
            }
        }
        }
    }
}

/// The rectangles of one bar, bottom up: class, top and height, scaled to `highest`.
/// A count above zero is at least one unit high.
fn stack(classes: &BTreeMap<&str, i64>, highest: i64) -> Vec<(&'static str, i64, i64)> {
    let mut bottom = PLOT_TOP + PLOT_HEIGHT;
    let mut rects = Vec::new();
    for class in CLASSES {
        let count = classes.get(class).copied().unwrap_or(0);
        if count == 0 {
            continue;
        }
        let height = (count * PLOT_HEIGHT / highest).max(1);
        bottom -= height;
        rects.push((class, bottom, height));
    }
    rects
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(ago: i32, outcome: &str, count: i64) -> OutcomeMinute {
        OutcomeMinute {
            minutes_ago: ago,
            outcome: outcome.into(),
            count,
        }
    }

    #[test]
    fn bars_stack_outcomes_scaled_to_the_busiest_minute() {
        let svg = outcomes(&[
            minute(0, "resolved", 30),
            minute(0, "retry", 10),
            minute(59, "permanent_failure", 4),
        ])
        .into_string();
        assert!(
            svg.contains("this minute: 10 retry, 30 resolved")
                || svg.contains("this minute: 30 resolved, 10 retry"),
            "{svg}"
        );
        assert!(svg.contains("59 min ago: 4 permanent_failure"), "{svg}");
        assert!(svg.contains("peak 40 a minute"), "{svg}");
        assert!(!svg.contains("style="), "colours come from the stylesheet");
        assert!(
            svg.contains(
                r#"<span class="swatch failed" aria-hidden="true"></span>permanent failure"#
            ),
            "the legend names each colour: {svg}"
        );
        let mut classes = BTreeMap::new();
        classes.insert("ok", 30);
        classes.insert("retry", 10);
        assert_eq!(stack(&classes, 40), [("ok", 39, 75), ("retry", 14, 25)]);
    }

    #[test]
    fn an_hour_without_attempts_says_so() {
        assert!(outcomes(&[]).into_string().contains("No attempts"));
    }
}
