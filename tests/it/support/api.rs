//! The admin HTTP API on a loopback port over a test's store, and the two tokens
//! (`ops` with the operate role, `viewer` with the read role) the tests sign with.

use redrive::admin::{self, Tokens};
use redrive::config::{AdminToken, Role};
use redrive::{Fleet, Settings, Store};
use reqwest::StatusCode;
use serde_json::Value;
use std::net::SocketAddr;
use tokio_util::sync::CancellationToken;

pub(crate) const OPERATE: &str = "operate-token-0123456789";
pub(crate) const READ: &str = "read-token-0123456789ab";

pub(crate) fn with_tokens(mut settings: Settings) -> Settings {
    for (name, role, token) in [
        ("ops", Role::Operate, OPERATE),
        ("viewer", Role::Read, READ),
    ] {
        settings.admin.tokens.insert(
            name.into(),
            AdminToken {
                role,
                token: token.to_owned().into(),
            },
        );
    }
    settings
}

/// The API on a loopback port, over `store`.
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) stop: CancellationToken,
}

impl Api {
    pub(crate) async fn start(store: &Store, settings: &Settings) -> Api {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: SocketAddr = listener.local_addr().unwrap();
        let fleet = Fleet::builder(settings.clone())
            .with_builtin_handlers()
            .build()
            .unwrap();
        let app = admin::router(
            fleet.operations(store.clone()),
            Tokens::new(&settings.admin),
        );
        let stop = CancellationToken::new();
        tokio::spawn(admin::serve(
            listener,
            app,
            stop.clone(),
            std::time::Duration::from_secs(1),
        ));
        Api {
            base: format!("http://{address}"),
            client: reqwest::Client::new(),
            stop,
        }
    }

    pub(crate) async fn get(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        answer(request.send().await.unwrap()).await
    }

    /// Posts `body` as it is (not necessarily JSON); the status and the text answered.
    pub(crate) async fn post_raw(
        &self,
        path: &str,
        token: &str,
        body: String,
    ) -> (StatusCode, String) {
        let response = (self.client.post(format!("{}{path}", self.base)))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    }

    pub(crate) async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: Value,
    ) -> (StatusCode, Value) {
        let mut request = self.client.post(format!("{}{path}", self.base)).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        answer(request.send().await.unwrap()).await
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(crate) async fn answer(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text:?}"));
    (status, body)
}
