//! The operator console served by a real member process (`redrive run`), signed into
//! with the API's tokens, and what its tests share: tasks to list, and the security
//! headers every answer carries.

use redrive::{Failure, NewTask, Settings, Store, TaskId};
use reqwest::header::{HeaderMap, SET_COOKIE};
use reqwest::StatusCode;
use std::time::Duration;

use super::api::{OPERATE, READ};
use super::{eventually, Browser, MemberProcess, Spawn};

/// The console's Content Security Policy, as the issue asks for it.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
    base-uri 'none'";

/// A member serving the console, with an operate token (`ops`) and a read token
/// (`viewer`).
pub(crate) struct Console {
    pub(crate) base: String,
    pub(crate) member: MemberProcess,
}

impl Console {
    /// Starts `redrive run` on `settings`' schema with the admin listener on a free
    /// port; its worker (serving `log`) runs when `worker` is set.
    pub(crate) async fn start(settings: &Settings, worker: bool) -> Console {
        Console::start_configured(settings, worker, None).await
    }

    /// [`Console::start`], with `settings`' Kafka cluster and the configuration file
    /// `config` (routes, say).
    pub(crate) async fn start_configured(
        settings: &Settings,
        worker: bool,
        config: Option<&std::path::Path>,
    ) -> Console {
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let member = Spawn::binary(settings).envs(&[
            ("REDRIVE__ADMIN__LISTEN", &listen),
            (
                "REDRIVE__WORKER__ENABLED",
                if worker { "true" } else { "false" },
            ),
            ("REDRIVE__WORKER__POLL_INTERVAL", "100ms"),
            ("REDRIVE__ADMIN__TOKENS__OPS__ROLE", "operate"),
            ("REDRIVE__ADMIN__TOKENS__OPS__TOKEN", OPERATE),
            ("REDRIVE__ADMIN__TOKENS__VIEWER__ROLE", "read"),
            ("REDRIVE__ADMIN__TOKENS__VIEWER__TOKEN", READ),
            (
                "REDRIVE__KAFKA__BOOTSTRAP_SERVERS",
                &settings.kafka.bootstrap_servers,
            ),
        ]);
        let member = match config {
            Some(config) => member.config(config),
            None => member,
        }
        .start();
        let base = format!("http://{listen}");
        let login = format!("{base}/console/login");
        eventually(Duration::from_secs(60), "the console answers", || async {
            reqwest::get(&login)
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        })
        .await;
        Console { base, member }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signs `browser` in with `token` from the page `path` asks for.
    pub(crate) async fn sign_in(&self, browser: &Browser, token: &str, path: &str) {
        browser.open(&self.url(path)).await;
        assert!(
            browser.path().await.starts_with("/console/login?next="),
            "{}",
            browser.path().await
        );
        browser.fill("#token", token).await;
        browser.follow("form.login button[type=submit]").await;
    }
}

/// A task for `handler` whose failure holds `key` and `value`.
pub(crate) fn task(handler: &str, key: &[u8], value: &[u8]) -> NewTask {
    NewTask {
        handler: handler.into(),
        failure: Failure {
            key: Some(key.to_vec()),
            value: Some(value.to_vec()),
            ..Failure::default()
        },
        ..NewTask::default()
    }
}

/// Stores `tasks`; their ids.
pub(crate) async fn enqueue(store: &Store, tasks: Vec<NewTask>) -> Vec<TaskId> {
    let stored = store.enqueue_many(&tasks).await.unwrap();
    stored.iter().map(|e| e.id()).collect()
}

/// Checks the security headers of an answer.
pub(crate) fn assert_secured(what: &str, headers: &HeaderMap) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    assert_eq!(header("content-security-policy"), Some(POLICY), "{what}");
    assert_eq!(header("x-content-type-options"), Some("nosniff"), "{what}");
    assert_eq!(header("referrer-policy"), Some("same-origin"), "{what}");
}

/// Signs in over HTTP with `token`: the session cookie.
pub(crate) async fn session(client: &reqwest::Client, console: &Console, token: &str) -> String {
    let signed_in = client
        .post(console.url("/console/login"))
        .form(&[("token", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::SEE_OTHER);
    let cookie = signed_in.headers()[SET_COOKIE].to_str().unwrap();
    cookie.split(';').next().unwrap().to_owned()
}
