//! `redrive brake`: the bad-deploy brakes of process-mode routes, and releasing one.

use anyhow::{bail, Context};
use clap::Subcommand;

use super::operator::cli_operator;
use super::output::outln;
use super::table;
use crate::config::Settings;
use crate::store::{Brake, Store};

/// `redrive brake ...`
#[derive(Debug, Subcommand)]
pub enum BrakeCommand {
    /// Every route with a brake: engaged or not, until when, why, trips.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
pub async fn run(command: BrakeCommand, settings: &Settings, store: &Store) -> anyhow::Result<()> {
    match command {
        BrakeCommand::List { json } => list(settings, store, json).await,
        BrakeCommand::Release { route, reason } => {
            let known = settings.routes.iter().any(|r| r.name == route)
                || store.brakes().await?.iter().any(|b| b.route == route);
            if !known {
                bail!("route {route:?} has no brake: configure brake on a process-mode route");
            }
            let brake = store
                .release_brake(&route, &cli_operator(Some(reason)))
                .await
                .context("releasing the brake")?;
            outln!(
                "brake of {route} released (engaged {} times); the route resumes",
                brake.trips
            );
            Ok(())
        }
    }
}

async fn list(settings: &Settings, store: &Store, json: bool) -> anyhow::Result<()> {
    let mut brakes = store.brakes().await?;
    // Configured brakes that never engaged have no row yet.
    for route in settings.routes.iter().filter(|r| r.brake.is_some()) {
        if !brakes.iter().any(|b| b.route == route.name) {
            brakes.push(Brake {
                route: route.name.clone(),
                engaged_until: None,
                engaged_at: None,
                engaged_by: None,
                reason: None,
                trips: 0,
                released_at: None,
                released_by: None,
            });
        }
    }
    brakes.sort_by(|a, b| a.route.cmp(&b.route));
    if json {
        outln!("{}", serde_json::to_string_pretty(&brakes)?);
        return Ok(());
    }
    let now = chrono::Utc::now();
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let rows: Vec<Vec<String>> = brakes
        .iter()
        .map(|b| {
            vec![
                b.route.clone(),
                if b.engaged(now) { "engaged" } else { "off" }.to_owned(),
                if b.engaged(now) {
                    time(b.engaged_until)
                } else {
                    String::new()
                },
                b.trips.to_string(),
                time(b.engaged_at),
                b.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::print(
        &["ROUTE", "BRAKE", "UNTIL", "TRIPS", "LAST ENGAGED", "REASON"],
        &rows,
    );
    Ok(())
}
