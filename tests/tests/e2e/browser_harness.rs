//! The browser harness (tests/src/browser.rs) works: headless Chromium under chromedriver
//! loads a page served on `http://localhost:<port>`, and a virtual authenticator registers a
//! passkey and signs assertions with it, with user verification that a test can make fail.
//! Needs Chromium and chromedriver (scripts/browser.sh installs them); fails loudly without.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use airlock_tests::browser::Browser;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(15);

/// The page under test: `#register` creates a resident ES256 passkey for RP `localhost` with
/// user verification required; `#assert` gets an assertion for it with the user verification
/// requirement typed into `#uv`. Each writes its outcome into `#status`:
/// `registered:<credential id>`, `asserted:<UV flag>` or `error:<name>:<message>`.
const PAGE: &str = r#"<!doctype html>
<html>
<head><meta charset="utf-8"><title>Airlock passkey harness</title></head>
<body>
<h1>Passkey harness</h1>
<label>userVerification <input id="uv" value="required"></label>
<button id="register">Register</button>
<button id="assert">Assert</button>
<p id="status" data-state="idle"></p>
<script>
const statusEl = document.getElementById('status');
function show(text) { statusEl.textContent = text; }
function b64u(buf) {
  return btoa(String.fromCharCode(...new Uint8Array(buf)))
    .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
function random(n) { return crypto.getRandomValues(new Uint8Array(n)); }
let credentialId = null;

document.getElementById('register').addEventListener('click', async () => {
  show('registering');
  try {
    const cred = await navigator.credentials.create({ publicKey: {
      rp: { id: 'localhost', name: 'Airlock harness' },
      user: { id: random(16), name: 'operator@airlock.test', displayName: 'Operator' },
      challenge: random(32),
      pubKeyCredParams: [{ type: 'public-key', alg: -7 }],
      authenticatorSelection: {
        residentKey: 'required', requireResidentKey: true, userVerification: 'required',
      },
      attestation: 'none',
      timeout: 10000,
    }});
    credentialId = cred.rawId;
    statusEl.dataset.state = 'registered';
    show('registered:' + b64u(cred.rawId));
  } catch (e) {
    show('error:' + e.name + ':' + e.message);
  }
});

document.getElementById('assert').addEventListener('click', async () => {
  show('asserting');
  try {
    const got = await navigator.credentials.get({ publicKey: {
      rpId: 'localhost',
      challenge: random(32),
      allowCredentials: [{ type: 'public-key', id: credentialId }],
      userVerification: document.getElementById('uv').value,
      timeout: 5000,
    }});
    // authenticatorData: rpIdHash (32 bytes), then the flags byte; bit 2 is UV.
    const flags = new Uint8Array(got.response.authenticatorData)[32];
    show('asserted:' + ((flags >> 2) & 1));
  } catch (e) {
    show('error:' + e.name + ':' + e.message);
  }
});
</script>
</body>
</html>
"#;

/// A static HTTP/1.1 server on 127.0.0.1 that answers `/` with [`PAGE`] and anything else
/// with 404. Stops when dropped (and after two minutes in any case).
struct Site {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Site {
    fn start() -> Site {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !flag.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut req = Vec::new();
                        let mut buf = [0u8; 4096];
                        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 65536 {
                            match stream.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => req.extend_from_slice(&buf[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&req);
                        let path = head.split_whitespace().nth(1).unwrap_or("");
                        let (status, body) = if path == "/" {
                            ("200 OK", PAGE)
                        } else {
                            ("404 Not Found", "not found")
                        };
                        let ctype = if path == "/" {
                            "text/html; charset=utf-8"
                        } else {
                            "text/plain"
                        };
                        let _ = write!(
                            stream,
                            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
                             Cache-Control: no-store\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Site {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test]
async fn virtual_authenticator_registers_and_asserts_with_user_verification() {
    let started = Instant::now();
    let site = Site::start();
    let url = format!("http://localhost:{}/", site.port);
    let mut browser = Browser::start().await;
    eprintln!("browser started in {:?}", started.elapsed());

    // Navigation and the DOM.
    browser.goto(&url).await;
    assert_eq!(browser.current_url().await, url);
    assert_eq!(browser.title().await, "Airlock passkey harness");
    assert!(browser.exists("#register").await);
    assert!(!browser.exists("#no-such-element").await);
    assert!(browser.page_source().await.contains("Passkey harness"));
    assert_eq!(
        browser.attribute("#status", "data-state").await.as_deref(),
        Some("idle")
    );
    assert_eq!(browser.attribute("#status", "data-missing").await, None);
    assert_eq!(
        browser
            .execute(
                "return window.isSecureContext && location.hostname;",
                vec![]
            )
            .await,
        json!("localhost")
    );
    assert_eq!(
        browser
            .execute_async(
                "const done = arguments[arguments.length - 1]; \
                 setTimeout(() => done(arguments[0] + 1), 10);",
                vec![json!(41)],
            )
            .await,
        json!(42)
    );

    // Cookies of the page's domain.
    browser.add_cookie("airlock_harness", "1").await;
    assert_eq!(
        browser.cookie("airlock_harness").await.expect("cookie")["value"],
        "1"
    );
    assert_eq!(
        browser.execute("return document.cookie;", vec![]).await,
        json!("airlock_harness=1")
    );
    browser.delete_cookies().await;
    assert!(browser.cookies().await.is_empty());

    // A screenshot is a PNG.
    let shot = std::env::temp_dir().join(format!("airlock-harness-{}.png", std::process::id()));
    browser.screenshot(&shot).await;
    let png = std::fs::read(&shot).expect("screenshot file");
    let _ = std::fs::remove_file(&shot);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    // Register a passkey with the virtual authenticator.
    browser.add_virtual_authenticator().await;
    assert!(browser.credentials().await.is_empty());
    browser.click("#register").await;
    let registered = browser.wait_for_text("#status", "registered:", WAIT).await;
    let credential_id = registered.trim_start_matches("registered:").to_string();
    assert!(!credential_id.is_empty());
    browser
        .wait_for("#status[data-state=registered]", WAIT)
        .await;

    // The authenticator holds it: one resident credential for RP localhost.
    let creds = browser.credentials().await;
    assert_eq!(creds.len(), 1, "{creds:?}");
    assert_eq!(creds[0]["credentialId"], json!(credential_id));
    assert_eq!(creds[0]["rpId"], "localhost");
    assert_eq!(creds[0]["isResidentCredential"], true);

    // An assertion with user verification required: signed, UV flag set.
    browser.click("#assert").await;
    let asserted = browser.wait_for_text("#status", "asserted:", WAIT).await;
    assert_eq!(asserted, "asserted:1");

    // User verification now fails: a UV-required assertion is refused...
    browser.set_user_verified(false).await;
    browser.click("#assert").await;
    let refused = browser.wait_for_text("#status", "error:", WAIT).await;
    assert!(refused.starts_with("error:NotAllowedError"), "{refused}");

    // ... while one that does not ask for UV is signed without the UV flag.
    browser.fill("#uv", "discouraged").await;
    browser.click("#assert").await;
    let unverified = browser.wait_for_text("#status", "asserted:", WAIT).await;
    assert_eq!(unverified, "asserted:0");

    // And verification can be restored.
    browser.set_user_verified(true).await;
    browser.fill("#uv", "required").await;
    browser.click("#assert").await;
    let asserted = browser.wait_for_text("#status", "asserted:", WAIT).await;
    assert_eq!(asserted, "asserted:1");

    // With the credential removed there is nothing to assert with.
    browser.remove_all_credentials().await;
    assert!(browser.credentials().await.is_empty());
    browser.click("#assert").await;
    let refused = browser.wait_for_text("#status", "error:", WAIT).await;
    assert!(refused.starts_with("error:NotAllowedError"), "{refused}");

    browser.close().await;
    drop(site);
    eprintln!("browser harness test took {:?}", started.elapsed());
}

/// A wait that times out says why: the element's text, the page's URL and its source. The
/// browser is still cleaned up (its drop runs while the test unwinds).
#[tokio::test]
#[should_panic(expected = "did not contain \"registered:\"")]
async fn a_timed_out_wait_reports_the_page() {
    let site = Site::start();
    let browser = Browser::start().await;
    browser
        .goto(&format!("http://localhost:{}/", site.port))
        .await;
    browser
        .wait_for_text("#status", "registered:", Duration::from_millis(300))
        .await;
}
