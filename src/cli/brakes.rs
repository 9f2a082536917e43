//! `redrive brakes`: the brakes of routes: list them, engage one on purpose (pausing a
//! route's consumption during an incident), release one.

use clap::Subcommand;

use super::table;
use crate::operations::{Actor, EngageRequest, Operations, ReasonRequest};
use crate::output::outln;

/// `redrive brakes ...`
#[derive(Debug, Subcommand)]
pub enum BrakesCommand {
    /// Every route's brake: engaged or not, until when, why, trips.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Engage a route's brake (any route, capture or process): every member stops
    /// consuming it within a second or so, until the hold ends or it is released.
    Engage {
        /// The route (its name).
        route: String,
        /// Why (written to the audit log and shown on the brake).
        #[arg(long)]
        reason: String,
        /// How long it holds unless released sooner, e.g. "30m" (default 1h, at most
        /// 7 days); engaging an engaged brake holds it this long from now.
        #[arg(long = "for")]
        hold: Option<String>,
    },
    /// Release an engaged brake: every member resumes the route within a second or so.
    Release {
        /// The route (its name).
        route: String,
        /// Why (written to the audit log).
        #[arg(long)]
        reason: String,
    },
}

/// Runs a brake verb.
pub async fn run(command: BrakesCommand, operations: &Operations) -> anyhow::Result<()> {
    let actor = Actor::shell();
    match command {
        BrakesCommand::List { json } => list(operations, json).await,
        BrakesCommand::Engage {
            route,
            reason,
            hold,
        } => {
            let request = EngageRequest {
                reason: Some(reason),
                hold,
            };
            let brake = operations.engage_brake(&actor, &route, &request).await?;
            let until = brake
                .engaged_until
                .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC"));
            outln!(
                "brake of {route} engaged until {}; the route stops consuming on every member",
                until.map(|t| t.to_string()).unwrap_or_default()
            );
            Ok(())
        }
        BrakesCommand::Release { route, reason } => {
            let request = ReasonRequest {
                reason: Some(reason),
            };
            let brake = operations.release_brake(&actor, &route, &request).await?;
            outln!(
                "brake of {route} released (engaged {} times); the route resumes",
                brake.trips
            );
            Ok(())
        }
    }
}

async fn list(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let page = operations.brakes().await?;
    let now = chrono::Utc::now();
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let header = [
        "ROUTE",
        "BRAKE",
        "UNTIL",
        "TRIPS",
        "LAST ENGAGED",
        "BY",
        "REASON",
    ];
    table::print_page(&page, json, &header, "no brake has ever engaged", |b| {
        let engaged = b.engaged(now);
        vec![
            b.route.clone(),
            if engaged { "engaged" } else { "off" }.to_owned(),
            if engaged {
                time(b.engaged_until)
            } else {
                String::new()
            },
            b.trips.to_string(),
            time(b.engaged_at),
            b.engaged_by.clone().unwrap_or_default(),
            b.reason.clone().unwrap_or_default(),
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::BrakesCommand;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// One name per verb family: `brakes`, as in `/api/v1/brakes` and `breakers`; the
    /// earlier `brake` stays an alias, so that operators' scripts keep working.
    #[test]
    fn brakes_is_the_verb_and_brake_stays_its_alias() {
        for verb in ["brakes", "brake"] {
            let cli = Cli::try_parse_from(["redrive", verb, "list", "--json"])
                .unwrap_or_else(|error| panic!("`redrive {verb} list`: {error}"));
            assert!(
                matches!(
                    cli.command,
                    Command::Brakes(BrakesCommand::List { json: true })
                ),
                "{verb}: {:?}",
                cli.command
            );
        }
    }
}
