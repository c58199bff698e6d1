//! A minimal WebDriver client for browser tests: Debian's headless Chromium driven through
//! chromedriver over plain HTTP (reqwest), with a virtual WebAuthn authenticator so a test can
//! register and use passkeys on pages served on `http://localhost:<port>`.
//!
//! `Browser::start()` runs `/usr/bin/chromedriver` (or `$AIRLOCK_CHROMEDRIVER`) on a free
//! loopback port and opens a session of `/usr/bin/chromium` (or `$AIRLOCK_CHROMIUM`) with a
//! fresh profile dir. A missing binary is a loud failure ("run scripts/browser.sh"), never a
//! skip. Dropping the `Browser` (also while a test panics) ends the session, kills chromedriver
//! and every process it started, and removes the temp dir. chromedriver runs under a small `sh`
//! watchdog that kills its process group when the test process goes away, so even a test
//! process that is killed outright (SIGKILL, abort) leaves no browser running.
//!
//! Errors: every method panics with context (the WebDriver command, its error code and message),
//! as a test assertion would; [`Browser::command`] is the one that returns `Result`, for a test
//! that expects a WebDriver error.
//!
//! The virtual authenticator uses the WebDriver WebAuthn extension commands
//! (`/session/{id}/webauthn/authenticator...`), which chromedriver implements; [`Browser::cdp`]
//! sends a raw DevTools command for anything else.
//!
//! Use `http://localhost:<port>` (not `127.0.0.1`) for pages that call WebAuthn: the RP id must
//! be a domain, and `localhost` is a secure context over plain HTTP (Chromium treats it as
//! loopback; serve on 127.0.0.1).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
pub use reqwest::Method;
use serde_json::{json, Value};

/// Every HTTP call to chromedriver gives up after this long, so a hung browser cannot hang the
/// suite. Longer than the page-load and script timeouts below, so those report first.
const HTTP_TIMEOUT: Duration = Duration::from_secs(45);
/// The session's page-load and async-script timeouts (milliseconds).
const PAGE_LOAD_MS: u64 = 30_000;
const SCRIPT_MS: u64 = 30_000;
/// The key of an element reference in WebDriver JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Chromium's command-line flags (besides `--user-data-dir`): headless, no sandbox (tests run
/// as root in containers), and as little background network traffic as the flags allow.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

/// Runs chromedriver (`"$@"`) until it exits or this shell's stdin reaches EOF, then kills its
/// process group (itself, chromedriver and Chromium).
const WATCHDOG: &str = "exec 3<&0 </dev/null
{ read -r line <&3; kill -9 0; } &
exec 3<&-
\"$@\"
kill -9 0";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// `$var` if set, else `default`; panics with the install hint if that file is missing.
fn find_binary(var: &str, default: &str, what: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default));
    assert!(
        path.is_file(),
        "{what} not found at {} (set ${var} to use another): run scripts/browser.sh, which \
         installs Debian's chromium and chromium-driver",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(HTTP_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client")
}

/// The last `max` characters of a file (a log), for a panic message.
fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text
        .char_indices()
        .rev()
        .nth(max)
        .map(|(i, _)| i)
        .unwrap_or(0);
    text[start..].to_string()
}

/// At most `max` characters of `s`, with a marker when cut.
fn snippet(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…[{} more bytes]", &s[..i], s.len() - i),
        None => s.to_string(),
    }
}

/// A headless Chromium session under a chromedriver this value owns.
pub struct Browser {
    client: reqwest::Client,
    /// chromedriver's base URL, `http://127.0.0.1:<port>`.
    driver: String,
    /// The WebDriver session id (None once the session has been deleted).
    session: Option<String>,
    child: Option<Child>,
    /// A fresh dir holding Chromium's profile and chromedriver's log.
    dir: PathBuf,
    /// The virtual authenticator that [`Browser::add_virtual_authenticator`] added last.
    authenticator: Option<String>,
}

impl Browser {
    /// Starts chromedriver and opens a headless Chromium session. Panics (with the hint to run
    /// scripts/browser.sh) when either binary is missing, or with chromedriver's log when the
    /// browser does not start.
    pub async fn start() -> Browser {
        let chromedriver = find_binary(
            "AIRLOCK_CHROMEDRIVER",
            "/usr/bin/chromedriver",
            "chromedriver",
        );
        let chromium = find_binary("AIRLOCK_CHROMIUM", "/usr/bin/chromium", "Chromium");

        remove_stale_dirs();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "airlock-browser-{}-{n}-{nanos:x}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("profile")).expect("browser temp dir");

        // The port is free when picked; another process could take it before chromedriver
        // binds it, so a driver that exits at once is retried on a new port.
        let client = http_client();
        let log_path = dir.join("chromedriver.log");
        let marker = dir.display().to_string();
        let mut attempt = 0;
        let (child, driver) = loop {
            attempt += 1;
            let port = free_port();
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .expect("chromedriver log file");
            // chromedriver runs under a watchdog shell, the leader of a new process group that
            // chromedriver and Chromium join: when its stdin (a pipe from this process) closes,
            // on drop or because this process died, it kills the whole group.
            let mut child = Command::new("sh")
                .args(["-c", WATCHDOG, "airlock-chromedriver"])
                .arg(&chromedriver)
                .arg(format!("--port={port}"))
                .process_group(0)
                // Chromium's crash database and caches go under the temp dir too, not into
                // ~/.config/chromium (and its crashpad handlers, which detach from their
                // parent, are then found by the temp dir on their command line).
                .env("XDG_CONFIG_HOME", dir.join("config"))
                .env("XDG_CACHE_HOME", dir.join("cache"))
                .stdin(Stdio::piped())
                .stdout(Stdio::from(log.try_clone().expect("log file")))
                .stderr(Stdio::from(log))
                .spawn()
                .unwrap_or_else(|e| panic!("spawn sh for {}: {e}", chromedriver.display()));
            let driver = format!("http://127.0.0.1:{port}");
            match wait_ready(&client, &driver, &mut child).await {
                Ok(()) => break (child, driver),
                Err(e) => {
                    kill_tree(child, &marker);
                    if attempt < 3 {
                        eprintln!(
                            "browser: chromedriver on port {port} did not start ({e}); retrying"
                        );
                        continue;
                    }
                    let log = tail(&log_path, 4000);
                    let _ = std::fs::remove_dir_all(&dir);
                    panic!(
                        "chromedriver did not start: {e}\n--- {}:\n{log}",
                        log_path.display()
                    );
                }
            }
        };
        let mut browser = Browser {
            client,
            driver,
            session: None,
            child: Some(child),
            dir: dir.clone(),
            authenticator: None,
        };

        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", dir.join("profile").display()));
        let caps = json!({
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "pageLoadStrategy": "normal",
                    "timeouts": { "implicit": 0, "pageLoad": PAGE_LOAD_MS, "script": SCRIPT_MS },
                    "goog:chromeOptions": {
                        "binary": chromium.display().to_string(),
                        "args": args,
                    },
                }
            }
        });
        let url = format!("{}/session", browser.driver);
        let value = match browser.send(Method::POST, &url, Some(&caps)).await {
            Ok(v) => v,
            Err(e) => panic!(
                "chromedriver could not start Chromium ({}): {e}\n--- chromedriver log:\n{}",
                chromium.display(),
                tail(&dir.join("chromedriver.log"), 4000)
            ),
        };
        let id = value["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("new session: no sessionId in {value}"));
        browser.session = Some(id.to_string());
        browser
    }

    /// The WebDriver session id.
    pub fn session_id(&self) -> &str {
        self.session.as_deref().expect("the session is closed")
    }

    /// One HTTP call to chromedriver; `Err("<error code>: <message>")` for a WebDriver error.
    async fn send(&self, method: Method, url: &str, body: Option<&Value>) -> Result<Value, String> {
        let mut req = self.client.request(method.clone(), url);
        // POST always carries a JSON body (chromedriver rejects an empty one).
        if method == Method::POST {
            req = req.json(body.unwrap_or(&json!({})));
        }
        let resp = req.send().await.map_err(|e| format!("HTTP error: {e}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("HTTP error reading the body: {e}"))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("HTTP {status}, not JSON ({e}): {}", snippet(&text, 500)))?;
        let value = v.get("value").cloned().unwrap_or(Value::Null);
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            let message = value["message"].as_str().unwrap_or("");
            return Err(format!("{error}: {message}"));
        }
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", snippet(&text, 500)));
        }
        Ok(value)
    }

    /// A WebDriver command on this session: `path` is relative to `/session/{id}` (e.g.
    /// `"/url"`, or `""` for the session itself). Returns the response's `value`, or
    /// `Err("<error code>: <message>")`. For commands this client has no method for.
    pub async fn command(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let url = format!("{}/session/{}{path}", self.driver, self.session_id());
        self.send(method, &url, body.as_ref()).await
    }

    /// [`Browser::command`], panicking with the command and error.
    async fn cmd(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let what = format!("{method} {path}");
        match self.command(method, path, body).await {
            Ok(v) => v,
            Err(e) => panic!("WebDriver {what} failed: {e}"),
        }
    }

    /// Sends a Chrome DevTools Protocol command (chromedriver's `goog/cdp/execute`).
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.cmd(
            Method::POST,
            "/goog/cdp/execute",
            Some(json!({ "cmd": cmd, "params": params })),
        )
        .await
    }

    // ---- navigation ----

    /// Loads `url` and waits for the page's load event.
    pub async fn goto(&self, url: &str) {
        self.cmd(Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    pub async fn current_url(&self) -> String {
        self.cmd(Method::GET, "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn title(&self) -> String {
        self.cmd(Method::GET, "/title", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn page_source(&self) -> String {
        self.cmd(Method::GET, "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    // ---- elements ----

    /// The id of all elements matching a CSS selector (empty if none).
    async fn find_all(&self, css: &str) -> Vec<String> {
        let v = self
            .cmd(
                Method::POST,
                "/elements",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await;
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e[ELEMENT_KEY].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn try_find(&self, css: &str) -> Result<String, String> {
        let v = self
            .command(
                Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": css })),
            )
            .await?;
        v[ELEMENT_KEY]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("no element reference in {v}"))
    }

    /// The WebDriver element id of the first element matching `css`; panics if none.
    pub async fn find(&self, css: &str) -> String {
        match self.try_find(css).await {
            Ok(id) => id,
            Err(e) => panic!(
                "find {css:?} on {}: {e}",
                self.command(Method::GET, "/url", None)
                    .await
                    .unwrap_or_default()
            ),
        }
    }

    /// Whether any element matches `css` now.
    pub async fn exists(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.cmd(Method::POST, &format!("/element/{id}/click"), None)
            .await;
    }

    /// Clears an input and types `text` into it.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.cmd(Method::POST, &format!("/element/{id}/clear"), None)
            .await;
        self.cmd(
            Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// The rendered text of the first element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.cmd(Method::GET, &format!("/element/{id}/text"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// An attribute (or, where none, the property) of the first element matching `css`.
    pub async fn attribute(&self, css: &str, name: &str) -> Option<String> {
        let id = self.find(css).await;
        let v = self
            .cmd(
                Method::GET,
                &format!("/element/{id}/attribute/{name}"),
                None,
            )
            .await;
        match v {
            Value::Null => None,
            Value::String(s) => Some(s),
            other => Some(other.to_string()),
        }
    }

    /// Runs `script` as a function body (`arguments[i]` are `args`) and returns what it returns.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Value {
        self.cmd(
            Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Runs `script` as an async function body: it reports by calling the callback passed as
    /// its last argument (`arguments[arguments.length - 1]`), within the script timeout (30 s).
    pub async fn execute_async(&self, script: &str, args: Vec<Value>) -> Value {
        self.cmd(
            Method::POST,
            "/execute/async",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Waits until an element matches `css`; panics after `timeout` with the URL and page.
    pub async fn wait_for(&self, css: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.exists(css).await {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "no element {css:?} after {timeout:?}\n{}",
                    self.describe_page().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the first element matching `css` has text containing `substring`, and
    /// returns that text. Polls every 100 ms; after `timeout` panics with the element's text,
    /// the page's URL and a snippet of its source.
    pub async fn wait_for_text(&self, css: &str, substring: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            // The element may not exist yet or be replaced between find and read.
            let current = match self.try_find(css).await {
                Ok(id) => self
                    .command(Method::GET, &format!("/element/{id}/text"), None)
                    .await
                    .map(|v| v.as_str().unwrap_or_default().to_string()),
                Err(e) => Err(e),
            };
            if let Ok(text) = &current {
                if text.contains(substring) {
                    return text.clone();
                }
            }
            if Instant::now() > deadline {
                let now = match current {
                    Ok(text) => format!("its text is {text:?}"),
                    Err(e) => format!("it cannot be read ({e})"),
                };
                panic!(
                    "{css:?} did not contain {substring:?} after {timeout:?}: {now}\n{}",
                    self.describe_page().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The URL and a snippet of the source, for a failure message (never panics).
    async fn describe_page(&self) -> String {
        let url = self
            .command(Method::GET, "/url", None)
            .await
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|e| format!("<unknown: {e}>"));
        let source = self
            .command(Method::GET, "/source", None)
            .await
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|e| format!("<unknown: {e}>"));
        format!("page {url}, source:\n{}", snippet(&source, 3000))
    }

    /// Saves a PNG screenshot of the viewport to `path`.
    pub async fn screenshot(&self, path: impl AsRef<Path>) {
        let v = self.cmd(Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("screenshot is base64");
        std::fs::write(path.as_ref(), png)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.as_ref().display()));
    }

    // ---- cookies (of the current page's domain) ----

    /// The cookies visible to the current page, as WebDriver cookie objects (`name`, `value`,
    /// `path`, `domain`, `secure`, `httpOnly`, `expiry`, `sameSite`).
    pub async fn cookies(&self) -> Vec<Value> {
        match self.cmd(Method::GET, "/cookie", None).await {
            Value::Array(a) => a,
            other => panic!("cookies: not an array: {other}"),
        }
    }

    /// The cookie `name` of the current page, if any.
    pub async fn cookie(&self, name: &str) -> Option<Value> {
        self.cookies().await.into_iter().find(|c| c["name"] == name)
    }

    /// Sets a cookie on the current page's domain (path `/`).
    pub async fn add_cookie(&self, name: &str, value: &str) {
        self.add_cookie_object(json!({ "name": name, "value": value, "path": "/" }))
            .await;
    }

    /// Sets a cookie given as a WebDriver cookie object (name, value and optional fields).
    pub async fn add_cookie_object(&self, cookie: Value) {
        self.cmd(Method::POST, "/cookie", Some(json!({ "cookie": cookie })))
            .await;
    }

    /// Deletes every cookie of the current page's domain.
    pub async fn delete_cookies(&self) {
        self.cmd(Method::DELETE, "/cookie", None).await;
    }

    // ---- virtual WebAuthn authenticator (WebDriver WebAuthn extension) ----

    /// Adds a virtual platform authenticator (CTAP2, transport `internal`, resident keys, user
    /// verification that succeeds) to this session and returns its id; the authenticator
    /// methods below act on it. It answers every `navigator.credentials` call of the session's
    /// pages, with no UI.
    pub async fn add_virtual_authenticator(&mut self) -> String {
        self.add_virtual_authenticator_with(json!({
            "protocol": "ctap2",
            "transport": "internal",
            "hasResidentKey": true,
            "hasUserVerification": true,
            "isUserVerified": true,
        }))
        .await
    }

    /// Adds a virtual authenticator with the given options (WebDriver's
    /// `Virtual Authenticator Options`), makes it the current one and returns its id.
    pub async fn add_virtual_authenticator_with(&mut self, options: Value) -> String {
        let v = self
            .cmd(Method::POST, "/webauthn/authenticator", Some(options))
            .await;
        let id = v
            .as_str()
            .unwrap_or_else(|| panic!("add virtual authenticator: no id in {v}"))
            .to_string();
        self.authenticator = Some(id.clone());
        id
    }

    fn authenticator_path(&self) -> String {
        let id = self
            .authenticator
            .as_deref()
            .expect("no virtual authenticator: call add_virtual_authenticator first");
        format!("/webauthn/authenticator/{id}")
    }

    /// Whether the authenticator's user verification (the "fingerprint") succeeds.
    pub async fn set_user_verified(&self, verified: bool) {
        let path = format!("{}/uv", self.authenticator_path());
        self.cmd(
            Method::POST,
            &path,
            Some(json!({ "isUserVerified": verified })),
        )
        .await;
    }

    /// The credentials the authenticator holds: `credentialId` (base64url), `rpId`,
    /// `isResidentCredential`, `userHandle`, `signCount` and `privateKey` (base64url PKCS#8).
    pub async fn credentials(&self) -> Vec<Value> {
        let path = format!("{}/credentials", self.authenticator_path());
        match self.cmd(Method::GET, &path, None).await {
            Value::Array(a) => a,
            other => panic!("credentials: not an array: {other}"),
        }
    }

    /// Imports a credential (WebDriver's `Credential Parameters`: `credentialId`,
    /// `isResidentCredential`, `rpId`, `privateKey`, `userHandle`, `signCount`).
    pub async fn add_credential(&self, credential: Value) {
        let path = format!("{}/credential", self.authenticator_path());
        self.cmd(Method::POST, &path, Some(credential)).await;
    }

    pub async fn remove_all_credentials(&self) {
        let path = format!("{}/credentials", self.authenticator_path());
        self.cmd(Method::DELETE, &path, None).await;
    }

    /// Removes the current virtual authenticator.
    pub async fn remove_virtual_authenticator(&mut self) {
        let path = self.authenticator_path();
        self.cmd(Method::DELETE, &path, None).await;
        self.authenticator = None;
    }

    // ---- shutdown ----

    /// Ends the session (Chromium quits), then stops chromedriver and removes the temp dir.
    /// Dropping does the same; this one reports a failure to end the session.
    pub async fn close(mut self) {
        if let Some(id) = self.session.take() {
            let url = format!("{}/session/{id}", self.driver);
            if let Err(e) = self.send(Method::DELETE, &url, None).await {
                eprintln!("browser: deleting session {id} failed: {e}");
            }
        }
        // Drop stops chromedriver and removes the dir.
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session so Chromium quits cleanly. Drop cannot await, so a helper thread
        // with its own runtime and client does the one request (bounded by 10 s).
        if let Some(id) = self.session.take() {
            let url = format!("{}/session/{id}", self.driver);
            let _ = std::thread::spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async {
                    let client = http_client();
                    let _ = client
                        .delete(&url)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                });
            })
            .join();
        }
        if let Some(child) = self.child.take() {
            kill_tree(child, &self.dir.display().to_string());
        }
        for _ in 0..10 {
            match std::fs::remove_dir_all(&self.dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => break,
            }
        }
    }
}

/// Polls chromedriver's `/status` until it is ready (up to 20 s).
async fn wait_ready(
    client: &reqwest::Client,
    driver: &str,
    child: &mut Child,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = format!("{driver}/status");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("chromedriver exited: {status}"));
        }
        let req = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(resp) = req {
            if let Ok(v) = resp.json::<Value>().await {
                if v["value"]["ready"] == Value::Bool(true) {
                    return Ok(());
                }
            }
        }
        if Instant::now() > deadline {
            return Err("not ready after 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- processes, from /proc (no libc) ----

/// Stops the watchdog `child`, chromedriver and every process it started (Chromium and its
/// helpers): closing the watchdog's stdin kills their process group; then whatever is left
/// among them, found by parent pid and by `marker` (the temp dir) on their command line, is
/// killed too. Reaps the watchdog and waits (up to 5 s) for the others to go.
fn kill_tree(mut child: Child, marker: &str) {
    let mut pids = descendants(child.id());
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(2);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    pids.extend(processes_mentioning(marker));
    pids.sort_unstable();
    pids.dedup();
    kill_all(&pids);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes the temp dirs of test processes that died without dropping their `Browser`
/// (named `airlock-browser-<pid>-...`, for a pid no longer running).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("airlock-browser-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// (pid, parent pid, state) of every process.
fn process_table() -> Vec<(u32, u32, char)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may contain spaces and parentheses.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let ppid = fields.next()?.parse().ok()?;
            Some((pid, ppid, state))
        })
        .collect()
}

/// Every live descendant of `root`.
fn descendants(root: u32) -> Vec<u32> {
    let table = process_table();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid, _) in &table {
            if ppid == p && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

/// Every process (but this one) whose command line contains `marker`.
fn processes_mentioning(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    process_table()
        .into_iter()
        .map(|(pid, _, _)| pid)
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .collect()
}

/// Whether `pid` is running (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 2..];
            rest.chars().next()
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// SIGKILLs `pids` (with the shell's `kill`, which every system has).
fn kill_all(pids: &[u32]) {
    let live: Vec<String> = pids
        .iter()
        .filter(|p| alive(**p))
        .map(u32::to_string)
        .collect();
    if live.is_empty() {
        return;
    }
    let _ = Command::new("sh")
        .args(["-c", "kill -9 \"$@\" 2>/dev/null", "sh"])
        .args(&live)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
