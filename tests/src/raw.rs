//! HTTP/1.1 spoken by hand over TCP, for what a well-behaved client never does: stop in the
//! middle of a request line, its headers or its body (the server's read timeouts).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A connection to a server's listener (`http://127.0.0.1:PORT`).
pub fn connect(base: &str) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Writes `bytes` and leaves the connection as it is.
pub fn send(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(bytes).expect("write");
    s.flush().expect("flush");
}

/// Everything the server writes until it closes the connection, and how long that took;
/// `None` if it still holds the connection open after `limit`.
pub fn until_closed(s: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Duration)> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(start.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match s.read(&mut buf) {
            Ok(0) => return Some((got, start.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset closes the connection as well.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some((got, start.elapsed()))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// An HTTP/1.1 answer read off the wire.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// Header names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The JSON body (or its text, as a JSON string).
    pub body: Value,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Parses one answer (with a `Content-Length` body) from the bytes a connection gave.
pub fn parse(bytes: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(bytes);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer in {text:?}"));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(rest.len());
    let body_text = &rest[..len.min(rest.len())];
    let body = serde_json::from_str(body_text).unwrap_or(Value::String(body_text.to_string()));
    Answer {
        status,
        headers,
        body,
    }
}

/// A request head (`METHOD path HTTP/1.1`, `Host`, then `headers`), ended by the blank line.
pub fn head(method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut h = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}
