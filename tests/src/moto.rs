//! A local AWS emulator for tests: moto's server mode (DynamoDB, SQS, KMS, ...) on an
//! ephemeral loopback port, killed on drop.
//!
//! The server is `<repo>/.venv/bin/moto_server`, installed by `scripts/emulator.sh` (the
//! README's test command runs it), or `$AIRLOCK_MOTO_SERVER`. A missing server is a loud
//! failure; [`Moto::start_or_skip`] may skip instead, but only when the emulator is not
//! installed and `AIRLOCK_SKIP_AWS_TESTS=1` says so.
//!
//! moto accepts any credentials and region and does not check signatures, but it routes a
//! request to a service by the SigV4 `Authorization` header, so clients must sign (an
//! unsigned request lands in moto's S3). State is kept per region: use the same region
//! ([`Moto::REGION`]) for setup and for the code under test.
//!
//! With `AIRLOCK_MOTO_ZYGOTE` set (the test command sets it), a server is forked from a
//! warmed moto process listening on that Unix socket (`scripts/moto_serial.py --zygote`)
//! instead of started from scratch: the same fresh, empty server in its own process, ready
//! in milliseconds instead of about 1.5 s of CPU.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long to wait for the server to answer after spawning it.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A running moto server. Dropping it kills and reaps the process.
pub struct Moto {
    /// `http://127.0.0.1:PORT`: the endpoint for every AWS service.
    pub endpoint: String,
    pub port: u16,
    /// The server's stdout and stderr (one line per request); kept if a test panics.
    pub log: PathBuf,
    dir: PathBuf,
    process: Option<Process>,
}

/// The server's process: our child, or a child of the zygote.
enum Process {
    Child(Child),
    Forked { pid: u32, zygote: PathBuf },
}

impl Process {
    fn id(&self) -> u32 {
        match self {
            Process::Child(c) => c.id(),
            Process::Forked { pid, .. } => *pid,
        }
    }

    /// `Some(how)` once the process has exited.
    fn exited(&mut self) -> Option<String> {
        match self {
            Process::Child(c) => c.try_wait().ok().flatten().map(|s| s.to_string()),
            Process::Forked { pid, zygote } => {
                let answer = zygote_request(zygote, &format!("status {pid}"));
                (answer != "running").then_some(answer)
            }
        }
    }

    /// Kills and reaps it.
    fn kill(self) {
        match self {
            Process::Child(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            // Also called while a test panics (drop): no second panic.
            Process::Forked { pid, zygote } => {
                if let Err(e) = try_zygote_request(&zygote, &format!("kill {pid}")) {
                    eprintln!("moto server {pid} not killed by the zygote: {e}");
                }
            }
        }
    }
}

/// One request to the zygote (see `scripts/moto_serial.py`): one line out, one line back.
fn try_zygote_request(zygote: &Path, request: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(zygote)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("{request}\n").as_bytes())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer.trim().to_string())
}

/// [`try_zygote_request`], failing loudly: a zygote named but not answering is a broken
/// test machine, not a reason to start servers another way.
fn zygote_request(zygote: &Path, request: &str) -> String {
    try_zygote_request(zygote, request).unwrap_or_else(|e| {
        panic!(
            "the moto zygote at {} (AIRLOCK_MOTO_ZYGOTE) did not answer `{request}`: {e}",
            zygote.display()
        )
    })
}

/// The zygote's socket, when the environment names one.
fn zygote() -> Option<PathBuf> {
    std::env::var_os("AIRLOCK_MOTO_ZYGOTE")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

impl Moto {
    pub const REGION: &'static str = "us-east-1";
    /// moto's default account: ARNs and queue URLs carry it.
    pub const ACCOUNT_ID: &'static str = "123456789012";

    /// The repository root: the parent of this crate's manifest dir (independent of
    /// `CARGO_TARGET_DIR`).
    pub fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests crate has a parent dir")
            .to_path_buf()
    }

    /// `$AIRLOCK_MOTO_SERVER` (a `moto_server`-like program taking `-H HOST -p PORT`),
    /// else `<repo>/.venv/bin/python` running `scripts/moto_serial.py`: moto answering one
    /// request at a time, because its threaded server does not isolate concurrent
    /// DynamoDB transactions (see that script). The path may not exist.
    pub fn binary() -> PathBuf {
        match std::env::var_os("AIRLOCK_MOTO_SERVER") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => Self::repo_root().join(".venv/bin/python"),
        }
    }

    /// The command that starts the server, without its `-H`/`-p` arguments.
    fn command(bin: &Path) -> Command {
        let mut cmd = Command::new(bin);
        if std::env::var_os("AIRLOCK_MOTO_SERVER").is_none_or(|p| p.is_empty()) {
            cmd.arg(Self::repo_root().join("scripts/moto_serial.py"));
        }
        cmd
    }

    /// Starts a fresh server (empty state). Panics if the emulator is not installed or does
    /// not answer within 30 s.
    pub fn start() -> Moto {
        let bin = Self::binary();
        assert!(
            bin.exists(),
            "{} is missing: run scripts/emulator.sh (the README's test command does)",
            bin.display()
        );
        // The port is free when picked but another process could take it before moto binds
        // it: retry with a new port if the server exits before answering.
        let mut last_err = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin) {
                Ok(m) => return m,
                Err(e) => last_err = e,
            }
        }
        panic!("moto_server did not start: {last_err}");
    }

    /// Like [`Moto::start`], except that when the emulator is not installed and
    /// `AIRLOCK_SKIP_AWS_TESTS=1` is set it returns `None` (after a loud line on stderr), so
    /// the caller can return early. With the emulator installed it always starts it.
    pub fn start_or_skip() -> Option<Moto> {
        let bin = Self::binary();
        if !bin.exists() && std::env::var("AIRLOCK_SKIP_AWS_TESTS").as_deref() == Ok("1") {
            // Straight to the stderr handle: libtest captures eprintln! of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "!!!!! SKIPPING AWS TEST: {} is missing and AIRLOCK_SKIP_AWS_TESTS=1 \
                 (run scripts/emulator.sh to run it) !!!!!",
                bin.display()
            );
            return None;
        }
        Some(Self::start())
    }

    fn try_start(bin: &Path) -> Result<Moto, String> {
        let port = free_port();
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("airlock-moto-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("temp dir {}: {e}", dir.display()))?;
        let log = dir.join("moto.log");
        let out = std::fs::File::create(&log).map_err(|e| format!("log file: {e}"))?;
        let process = match zygote() {
            Some(zygote) => {
                // The zygote's protocol is words on a line: no spaces in the paths.
                let (Some(log_path), Some(cwd)) = (log.to_str(), dir.to_str()) else {
                    panic!("a path the moto zygote cannot take: {}", dir.display());
                };
                assert!(
                    !cwd.contains(char::is_whitespace),
                    "a path the moto zygote cannot take (a space in it): {cwd}"
                );
                let answer = zygote_request(&zygote, &format!("start {port} {log_path} {cwd}"));
                let pid = answer
                    .strip_prefix("pid ")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or_else(|| panic!("the moto zygote answered `{answer}` to start"));
                Process::Forked { pid, zygote }
            }
            None => {
                let err = out.try_clone().map_err(|e| format!("log file: {e}"))?;
                let child = Self::command(bin)
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .env_remove("MOTO_PORT")
                    .current_dir(&dir)
                    .stdin(Stdio::null())
                    .stdout(Stdio::from(out))
                    .stderr(Stdio::from(err))
                    .spawn()
                    .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
                Process::Child(child)
            }
        };
        let mut moto = Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            log,
            dir,
            process: Some(process),
        };
        let start = Instant::now();
        loop {
            if let Some(status) = moto.process.as_mut().and_then(Process::exited) {
                moto.process = None;
                let e = format!("it exited with {status}; its log:\n{}", moto.log_text());
                moto.remove_dir();
                return Err(e);
            }
            if http_status(port, "GET", "/moto-api/", Duration::from_secs(2)) == Some(200) {
                return Ok(moto);
            }
            if start.elapsed() > READY_TIMEOUT {
                // Not a port race: no retry. Drop (while panicking) kills it, keeps the log.
                panic!(
                    "moto_server: no answer on {} after {READY_TIMEOUT:?}; log {}:\n{}",
                    moto.endpoint,
                    moto.log.display(),
                    moto.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What a child process (the airlock binary, a Lambda under test) needs to reach this
    /// server through the AWS SDK's default configuration chain.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", Self::REGION),
            // For Python/CLI tools (botocore reads only this one).
            ("AWS_DEFAULT_REGION", Self::REGION),
            ("AWS_EC2_METADATA_DISABLED", "true"),
            // The emulator on a busy test machine can take seconds where AWS takes
            // milliseconds: looser call limits than production's (1 s per attempt, 2 s per
            // call), whose fit in each function's timeout a template test checks.
            ("AIRLOCK_AWS_ATTEMPT_TIMEOUT_MS", "20000"),
            ("AIRLOCK_AWS_OPERATION_TIMEOUT_MS", "60000"),
            // moto answers one request at a time: a long poll would hold every other call.
            ("AIRLOCK_AWS_RECEIVE_WAIT_S", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// The OS process id of the server, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::id)
    }

    /// Whether the server answers HTTP now.
    pub fn is_up(&self) -> bool {
        http_status(self.port, "GET", "/moto-api/", Duration::from_secs(2)) == Some(200)
    }

    /// Wipes all emulated state (tables, queues, keys) in every region.
    pub fn reset(&self) {
        let status = http_status(
            self.port,
            "POST",
            "/moto-api/reset",
            Duration::from_secs(10),
        );
        assert_eq!(
            status,
            Some(200),
            "POST /moto-api/reset on {}",
            self.endpoint
        );
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills and reaps the server (idempotent; also done on drop).
    pub fn stop(&mut self) {
        if let Some(p) = self.process.take() {
            p.kill();
        }
    }

    fn remove_dir(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("moto_server log kept at {}", self.log.display());
        } else {
            self.remove_dir();
        }
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The status code of a bodiless HTTP/1.0 request to 127.0.0.1:port, or None if the
/// connection or the exchange fails.
fn http_status(port: u16, method: &str, path: &str, timeout: Duration) -> Option<u16> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.contains(&b'\n') && head.len() < 4096 {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    // Drain the rest so the server does not see a reset mid-response.
    let _ = std::io::copy(&mut s, &mut std::io::sink());
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    match parts.next() {
        Some(v) if v.starts_with("HTTP/") => parts.next()?.parse().ok(),
        _ => None,
    }
}
