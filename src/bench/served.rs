//! The router `redrive run` serves on its admin listener (the API and the console),
//! served by a benchmark on a loopback port, and an operator signed in to it as a
//! browser is.

use anyhow::Context;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::bench_fleet;
use crate::admin::{self, Tokens};
use crate::config::Settings;

/// The token the benchmark signs in with.
pub(super) const TOKEN: &str = "bench-console-token-0123456789";

/// An operator signed in to the console (and holding the API's token), as a browser is.
pub(super) struct Browser {
    /// The client, following no redirect.
    pub(super) client: reqwest::Client,
    /// `http://127.0.0.1:PORT`.
    pub(super) base: String,
    /// The session cookie (`name=value`).
    pub(super) cookie: String,
}

impl Browser {
    /// GETs `path` (`/console/...`) with the session, reads it whole, and fails unless
    /// it answered 200.
    pub(super) async fn open(&self, path: &str) -> anyhow::Result<()> {
        let response = (self.client.get(format!("{}{path}", self.base)))
            .header("cookie", &self.cookie)
            .send()
            .await?;
        let status = response.status();
        let body = response.text().await?;
        anyhow::ensure!(
            status == reqwest::StatusCode::OK,
            "GET {path} answered {status}: {}",
            body.chars().take(300).collect::<String>()
        );
        Ok(())
    }
}

/// Serves the router `redrive run` serves on its admin listener (the API and the
/// console) on a loopback port and signs in to it; stops when the token is cancelled.
pub(super) async fn serve_console(
    settings: &Settings,
) -> anyhow::Result<(Browser, CancellationToken, tokio::task::JoinHandle<()>)> {
    let api_store = admin::api_store(&settings.database, &settings.admin)?;
    let operations = bench_fleet(settings, 100, 400)?.operations(api_store);
    let app = admin::router(operations, Tokens::new(&settings.admin));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    let serving = tokio::spawn(admin::serve(
        listener,
        app,
        stop.clone(),
        Duration::from_secs(5),
    ));
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let cookie = sign_in(&client, &base).await?;
    Ok((
        Browser {
            client,
            base,
            cookie,
        },
        stop,
        serving,
    ))
}

/// Signs in to the console with [`TOKEN`] as a browser does; answers the session cookie.
async fn sign_in(client: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let response = client
        .post(format!("{base}/console/login"))
        .form(&[("token", TOKEN), ("next", "/console/tasks")])
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::SEE_OTHER,
        "signing in answered {}",
        response.status()
    );
    let cookie = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .context("signing in set no cookie")?
        .to_str()?;
    Ok(cookie.split(';').next().unwrap_or_default().to_owned())
}
