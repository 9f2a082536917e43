//! A local HTTP server for webhook tests: records every request and answers as a
//! script decides.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The client's address: one per connection.
    pub peer: SocketAddr,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// What to answer.
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Body::empty(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub fn body(mut self, body: impl Into<Body>) -> Reply {
        self.body = body.into();
        self
    }

    pub fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

type Script = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// The running server; stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    /// Serves on a free loopback port, answering each request with `script`.
    pub async fn start(script: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> TestServer {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let script: Script = Arc::new(script);
        let recorder = requests.clone();
        let app = axum::Router::new().fallback(
            move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
                  method: Method,
                  uri: Uri,
                  headers: HeaderMap,
                  body: Bytes| {
                let recorder = recorder.clone();
                let script = script.clone();
                async move {
                    let recorded = Recorded {
                        peer,
                        method,
                        path: uri.path().to_owned(),
                        headers,
                        body,
                    };
                    let reply = script(&recorded);
                    recorder.lock().unwrap().push(recorded);
                    tokio::time::sleep(reply.delay).await;
                    let mut response =
                        Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
                    for (name, value) in reply.headers {
                        response = response.header(name, value);
                    }
                    response.body(reply.body).unwrap()
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await.unwrap();
        });
        TestServer {
            addr,
            requests,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
