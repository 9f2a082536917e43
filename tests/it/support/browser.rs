//! A real browser for the console's tests: Debian's headless Chromium, driven over
//! WebDriver by its `chromedriver` (packages `chromium` and `chromium-driver`), one
//! driver and one window of a fixed size per test. Screenshots go to
//! `target/console-screenshots/NAME.png`.

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The window every test sees.
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 1000;

/// A headless Chromium session and the chromedriver serving it; both end when dropped
/// (a test that fails ends them too).
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    port: u16,
    session: Option<String>,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session.
    pub async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut command = Command::new("chromedriver");
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; the driver dies with the test's thread.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let driver = command
            .spawn()
            .expect("chromedriver runs (apt-get install chromium chromium-driver)");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", format!("--window-size={WIDTH},{HEIGHT}")],
            }),
        );
        // A dialog stays open for the test to find, instead of being dismissed.
        capabilities.insert("unhandledPromptBehavior".into(), json!("ignore"));
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        let client = loop {
            let connected = ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await;
            match connected {
                Ok(client) => break client,
                Err(error) if start.elapsed() < Duration::from_secs(30) => {
                    let _ = error;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => panic!("no WebDriver session from chromedriver: {error}"),
            }
        };
        let session = client.session_id().await.unwrap();
        Browser {
            client,
            driver,
            port,
            session,
        }
    }

    /// Opens `url` and waits until the page has loaded.
    pub async fn open(&self, url: &str) {
        self.client.goto(url).await.expect(url);
    }

    /// The visible text of the first element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let element = self.client.find(Locator::Css(css)).await.expect(css);
        element.text().await.unwrap()
    }

    /// How many elements `css` selects.
    pub async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// Types `text` into the field `css` selects, after clearing it.
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.client.find(Locator::Css(css)).await.expect(css);
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Clicks the element `css` selects (a button that stays on the page).
    pub async fn click(&self, css: &str) {
        let element = self.client.find(Locator::Css(css)).await.expect(css);
        element.click().await.expect(css);
    }

    /// Clicks the link or submit button `css` selects, and waits until the browser
    /// has left the page (a click may return before the navigation starts).
    pub async fn follow(&self, css: &str) {
        let page = self.client.find(Locator::Css("html")).await.unwrap();
        self.click(css).await;
        let start = Instant::now();
        while page.attr("lang").await.is_ok() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "clicking {css} left no page"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The path and query of the page shown.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.unwrap();
        match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// Presses Tab once.
    pub async fn tab(&self) {
        self.press(Key::Tab).await;
    }

    /// Presses `key` once.
    pub async fn press(&self, key: Key) {
        let press = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: key.into() })
            .then(KeyAction::Up { value: key.into() });
        self.client.perform_actions(press).await.unwrap();
    }

    /// Presses Tab until the element with id `id` has the focus (at most 60 times).
    pub async fn tab_to(&self, id: &str) {
        for _ in 0..60 {
            self.tab().await;
            if self.focused_id().await == id {
                return;
            }
        }
        panic!("Tab never reached #{id}");
    }

    /// Types `text` into the element that has the focus.
    pub async fn type_here(&self, text: &str) {
        let element = self.client.active_element().await.unwrap();
        element.send_keys(text).await.unwrap();
    }

    /// The `id` of the element that has the keyboard focus (empty if it has none).
    pub async fn focused_id(&self) -> String {
        let element = self.client.active_element().await.unwrap();
        element.attr("id").await.unwrap().unwrap_or_default()
    }

    /// The text of the dialog open now (an `alert`, say), if one is.
    pub async fn open_dialog(&self) -> Option<String> {
        match self.client.get_alert_text().await {
            Ok(text) => Some(text),
            Err(error) if error.is_no_such_alert() => None,
            Err(error) => panic!("asking for a dialog: {error}"),
        }
    }

    /// Saves a screenshot of the whole page as `target/console-screenshots/NAME.png`
    /// (the window grows to the page's height for it, then shrinks back).
    pub async fn screenshot(&self, name: &str) {
        let height = self
            .client
            .execute("return document.documentElement.scrollHeight;", Vec::new())
            .await
            .unwrap()
            .as_u64()
            .unwrap_or(u64::from(HEIGHT));
        let tall = u32::try_from(height).unwrap_or(HEIGHT).clamp(HEIGHT, 6000);
        self.client
            .set_window_size(WIDTH, tall + 120)
            .await
            .unwrap();
        let png = self.client.screenshot().await.unwrap();
        self.client.set_window_size(WIDTH, HEIGHT).await.unwrap();
        let dir = screenshots();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Ends the session (Chromium exits) and the driver. Blocking, so that it can run
    /// in `drop`: a few milliseconds on loopback.
    fn end(&mut self) {
        if let Some(session) = self.session.take() {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let request = format!(
                    "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
                     Connection: close\r\n\r\n",
                    self.port
                );
                let _ = stream.write_all(request.as_bytes());
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.end();
    }
}

/// `target/console-screenshots`.
fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory holds tmp/")
        .join("console-screenshots")
}
