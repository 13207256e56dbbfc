//! A real headless Chromium driven through WebDriver (W3C), for the portal's browser tests.
//!
//! `chromedriver` (Debian: `chromium-driver`, with `chromium`) is started on a free port and
//! spoken to over HTTP with JSON, which is all the WebDriver protocol is: no client crate
//! needed. Each [`Browser`] is one session; dropping it ends the session and the driver.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use base64::Engine as _;
use serde_json::{json, Value};

/// The W3C element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    driver: Child,
}

/// Where chromedriver is: `CHROMEDRIVER`, or on `PATH`, or what `.ci/install-chromium`
/// installs from Debian's packages on a machine that lacks it (once; the script serialises
/// parallel callers).
fn chromedriver() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMEDRIVER") {
        return PathBuf::from(path);
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let candidate = dir.join("chromedriver");
        if candidate.exists() {
            return candidate;
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/install-chromium");
    let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().expect("run .ci/install-chromium");
    assert!(
        out.status.success(),
        "the portal's browser tests need chromedriver and Chromium, and .ci/install-chromium could not \
         install them (see its output above); install chromium and chromium-driver, or set CHROMEDRIVER"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().expect("the script prints a path").trim())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium window `width` × `height` pixels; files it
    /// downloads go to `downloads`.
    pub async fn start(width: u32, height: u32, downloads: &Path) -> Self {
        std::fs::create_dir_all(downloads).expect("download directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("port").port();
        let driver = Command::new(chromedriver())
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
        let base = format!("http://127.0.0.1:{port}");
        let mut options = json!({"args": [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            format!("--window-size={width},{height}"),
        ],
        "prefs": {
            "download.default_directory": downloads.canonicalize().expect("download directory"),
            "download.prompt_for_download": false,
        }});
        // A window is at least 500 pixels wide; a phone's viewport is drawn by emulating its
        // screen, so a page is laid out at exactly `width` CSS pixels.
        if width < 500 {
            options["mobileEmulation"] =
                json!({"deviceMetrics": {"width": width, "height": height, "pixelRatio": 1.0}});
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": options,
        }}});
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let session = loop {
            match http.post(format!("{base}/session")).json(&capabilities).send().await {
                Ok(r) => {
                    let v: Value = r.json().await.expect("a WebDriver answer");
                    match v["value"]["sessionId"].as_str() {
                        Some(id) => break id.to_owned(),
                        None => panic!("chromedriver refused the session: {v}"),
                    }
                }
                Err(_) if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("chromedriver did not answer: {e}"),
            }
        };
        Self { http, session: format!("{base}/session/{session}"), driver }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        match self.try_call(method, path, body).await {
            Ok(value) => value,
            Err(error) => panic!("WebDriver {path}: {error}"),
        }
    }

    /// A WebDriver command; its error as the driver reported it.
    async fn try_call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let v: Value = request.send().await.expect("WebDriver request").json().await.expect("WebDriver JSON");
        if v["value"]["error"].is_string() {
            return Err(v["value"].clone());
        }
        Ok(v["value"].clone())
    }

    /// Opens `url` and waits for the page to load.
    pub async fn open(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    /// The current URL.
    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None).await.as_str().unwrap_or_default().to_owned()
    }

    /// The page's visible text; empty while a page is being replaced by the next.
    pub async fn text(&self) -> String {
        let find = json!({"using": "css selector", "value": "body"});
        let Ok(body) = self.try_call(reqwest::Method::POST, "/element", Some(find)).await else { return String::new() };
        let Some(body) = body[ELEMENT].as_str() else { return String::new() };
        let text = self.try_call(reqwest::Method::GET, &format!("/element/{body}/text"), None).await;
        text.ok().and_then(|t| t.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// The page's HTML as the browser holds it.
    pub async fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None).await.as_str().unwrap_or_default().to_owned()
    }

    /// The first element matching a CSS selector, waiting up to ten seconds for it: a page a
    /// click or a redirect is still loading has not drawn it yet.
    pub async fn find(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let find = json!({"using": "css selector", "value": css});
        loop {
            let answer = self.try_call(reqwest::Method::POST, "/element", Some(find.clone())).await;
            if let Some(element) = answer.as_ref().ok().and_then(|v| v[ELEMENT].as_str()) {
                return element.to_owned();
            }
            if std::time::Instant::now() >= deadline {
                let why = answer.map_or_else(|e| e["message"].to_string(), |v| v.to_string());
                panic!("no element {css} ({why}) on {}:\n{}", self.url().await, self.text().await);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types `text` into the field matching `css`, replacing what it held.
    pub async fn fill(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{element}/clear"), Some(json!({}))).await;
        self.call(reqwest::Method::POST, &format!("/element/{element}/value"), Some(json!({"text": text}))).await;
    }

    /// Clicks the element matching `css` (a button submits its form and the next page loads).
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.call(reqwest::Method::POST, &format!("/element/{element}/click"), Some(json!({}))).await;
    }

    /// Saves a screenshot of the window as PNG under `dir`, named `name.png`.
    pub async fn screenshot(&self, dir: &Path, name: &str) {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap_or_default()).expect("PNG");
        std::fs::create_dir_all(dir).expect("screenshot directory");
        std::fs::write(dir.join(format!("{name}.png")), bytes).expect("write screenshot");
    }

    /// Waits until the browser is at a URL starting with `prefix` (a click's navigation may
    /// still be under way when the click returns).
    pub async fn wait_for_url(&self, prefix: &str, within: Duration) -> String {
        self.wait_for_url_where(|url| url.starts_with(prefix), prefix, within).await
    }

    /// Waits until the browser's URL satisfies `done`; `what` says what was awaited.
    pub async fn wait_for_url_where(&self, done: impl Fn(&str) -> bool, what: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let url = self.url().await;
            if done(&url) {
                return url;
            }
            assert!(std::time::Instant::now() < deadline, "still at {url}, not {what}:\n{}", self.text().await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits, without reloading, until the page's text contains `needle` (a form's answer
    /// still loading), or `within` passes.
    pub async fn wait_for_text_now(&self, needle: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = self.text().await;
            if text.contains(needle) {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "page never said {needle:?}; it says:\n{text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reloads until no element matches `css`, or panics once `within` passes.
    pub async fn wait_for_absent(&self, css: &str, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        let find = json!({"using": "css selector", "value": css});
        loop {
            let answer = self.try_call(reqwest::Method::POST, "/element", Some(find.clone())).await;
            if answer.as_ref().ok().and_then(|v| v[ELEMENT].as_str()).is_none() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{css} is still on {}", self.url().await);
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.call(reqwest::Method::POST, "/refresh", Some(json!({}))).await;
        }
    }

    /// Reloads until the page's text contains `needle` or `within` passes.
    pub async fn wait_for_text(&self, needle: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = self.text().await;
            if text.contains(needle) {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "page never said {needle:?}; it says:\n{text}");
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.call(reqwest::Method::POST, "/refresh", Some(json!({}))).await;
        }
    }
}

/// Where a piece of the page lies in the window, as the browser laid it out.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Shown {
    /// Its text as rendered (`innerText`).
    pub text: String,
    /// The label drawn before a table cell from its `data-label` (CSS `::before`), when one
    /// is drawn: `None` where the layout shows the column's header instead.
    pub label: Option<String>,
    pub left: f64,
    pub right: f64,
    pub width: f64,
    pub height: f64,
    /// Neither `display: none` nor `visibility: hidden`, itself or above.
    pub rendered: bool,
    /// The window's width in CSS pixels.
    pub viewport: f64,
}

impl Shown {
    /// Whether a person sees it without scrolling sideways: rendered, of non-zero size, and
    /// wholly within the window's width.
    pub fn in_view(&self) -> bool {
        self.rendered && self.width > 0.0 && self.height > 0.0 && self.left >= -0.5 && self.right <= self.viewport + 0.5
    }
}

/// The script behind [`Browser::column`] and [`Browser::shown`]: the layout of each match.
const LAYOUT: &str = r#"
const [mode, needle] = arguments;
const viewport = document.documentElement.clientWidth;
const rendered = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const s = getComputedStyle(e);
    if (s.display === 'none' || s.visibility === 'hidden') return false;
  }
  return true;
};
const describe = (el, rect) => {
  const before = getComputedStyle(el, '::before');
  const content = before.content;
  let label = null;
  if (content && content !== 'none' && content !== 'normal' && before.display !== 'none') {
    // Browsers give `attr(name)` either substituted (a quoted string) or as written.
    const attr = /^attr\(\s*([\w-]+)\s*\)$/.exec(content);
    label = attr ? el.getAttribute(attr[1]) : content.startsWith('"') ? JSON.parse(content) : content;
  }
  return { text: el.innerText, label, left: rect.left, right: rect.right, width: rect.width, height: rect.height,
           rendered: rendered(el), viewport };
};
const out = [];
if (mode === 'column') {
  for (const table of document.querySelectorAll('table')) {
    const heads = [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim());
    const index = heads.indexOf(needle);
    if (index < 0) continue;
    for (const row of table.querySelectorAll('tbody tr')) {
      const cell = row.children[index];
      if (cell) out.push(describe(cell, cell.getBoundingClientRect()));
    }
  }
} else {
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (!node.textContent.includes(needle)) continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    out.push(describe(node.parentElement, range.getBoundingClientRect()));
  }
}
return out;
"#;

impl Browser {
    /// The cells of every table column headed `header` (exactly), in page order, as laid
    /// out: on a phone a header row may be hidden, so each cell says what labels it.
    pub async fn column(&self, header: &str) -> Vec<Shown> {
        self.layout("column", header).await
    }

    /// Every run of text on the page that contains `needle`, as laid out.
    pub async fn shown(&self, needle: &str) -> Vec<Shown> {
        self.layout("text", needle).await
    }

    async fn layout(&self, mode: &str, needle: &str) -> Vec<Shown> {
        let v = self
            .call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": LAYOUT, "args": [mode, needle]})))
            .await;
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("a layout ({e}): {v}"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Best effort: ending the driver ends its browser too.
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
