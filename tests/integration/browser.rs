//! A real Chromium, headless, driven over WebDriver: chromedriver is started
//! here on a free loopback port in its own process group, and that group
//! (chromedriver and the browsers it started) is killed on drop.
//! `scripts/test` installs both from Debian's packages and names them in
//! `INBOXD_TEST_CHROMEDRIVER` and `INBOXD_TEST_CHROMIUM`.

use crate::support::{free_port, poll_until};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// How long a page may take to show what the test waits for: the console
/// refreshes every 2 s, and a busy CI machine is slow.
pub const PAGE_DEADLINE: Duration = Duration::from_secs(60);

/// Each look at the page is a WebDriver round trip; no need to ask more often.
const POLL: Duration = Duration::from_millis(100);

impl Browser {
    /// A 1280x800 window, the size of the screenshot in docs/operating.md.
    pub async fn start() -> Self {
        let driver_bin = std::env::var("INBOXD_TEST_CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let chromium = std::env::var("INBOXD_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {driver_bin} ({e}): scripts/test installs Debian's chromium and chromium-driver")
            });
        let up = poll_until(Duration::from_secs(30), || async move {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(up, "chromedriver did not listen on 127.0.0.1:{port}");
        let profile = tempfile::tempdir().expect("profile dir");
        let capabilities = serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Root in a container has no user namespace for Chromium's sandbox.
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    "--window-size=1280,800",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!("an object literal")
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session ({chromium}): {e}"));
        Self {
            client,
            driver,
            _profile: profile,
        }
    }

    /// The text of the first element matching `css`, if there is one now.
    pub async fn text(&self, css: &str) -> Option<String> {
        let element = self.client.find(Locator::Css(css)).await.ok()?;
        element.text().await.ok()
    }

    /// Waits until the element matching `css` shows text that `wanted` accepts;
    /// panics with what it showed last (and the page's error banner).
    pub async fn wait_text(&self, css: &str, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if let Some(text) = text.as_deref().filter(|t| wanted(t)) {
                return text.to_owned();
            }
            if started.elapsed() > PAGE_DEADLINE {
                let banner = self.text("#error").await.unwrap_or_default();
                panic!("the page never showed {what} at `{css}`: last {text:?}; error banner: {banner:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until an element matching `css` exists.
    pub async fn wait_for(&self, css: &str) {
        let found = poll_until(PAGE_DEADLINE, || async move {
            self.client.find(Locator::Css(css)).await.is_ok()
        })
        .await;
        let banner = self.text("#error").await.unwrap_or_default();
        assert!(found, "the page never showed `{css}`; error banner: {banner:?}");
    }

    /// Waits until exactly `n` elements match `css`.
    pub async fn wait_count(&self, css: &str, n: usize) {
        let started = Instant::now();
        loop {
            let now = self.count(css).await;
            if now == n {
                return;
            }
            if started.elapsed() > PAGE_DEADLINE {
                let banner = self.text("#error").await.unwrap_or_default();
                panic!("the page never showed {n} of `{css}` (it shows {now}); error banner: {banner:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(Locator::Css(css))
            .await
            .map(|all| all.len())
            .unwrap_or(0)
    }

    pub async fn click(&self, css: &str) {
        self.wait_for(css).await;
        let element = self.client.find(Locator::Css(css)).await.expect("found above");
        element
            .click()
            .await
            .unwrap_or_else(|e| panic!("cannot click `{css}`: {e}"));
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.wait_for(css).await;
        let element = self.client.find(Locator::Css(css)).await.expect("found above");
        element.clear().await.expect("clear");
        element
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("cannot type into `{css}`: {e}"));
    }

    /// Goes to a route of the page (`#/dead-letters`) without reloading it.
    pub async fn route(&self, hash: &str) {
        self.client
            .execute("location.hash = arguments[0];", vec![hash.into()])
            .await
            .expect("set location.hash");
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        self.stop();
    }

    fn stop(&mut self) {
        if matches!(self.driver.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on the process group of a child this test spawned
            // with `process_group(0)`: chromedriver and the browsers it started.
            unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
            let _ = self.driver.wait();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop();
    }
}
