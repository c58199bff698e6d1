//! A keep-alive front for the emulator, for measurements only.
//!
//! moto's server (werkzeug) closes every connection after one response, so a client on it
//! opens a TCP connection per AWS call, where AWS keeps them alive and the SDK reuses them
//! from its pool. A function's CPU measured directly on moto therefore includes a
//! connection setup and teardown per call that it does not pay on AWS. This proxy keeps
//! its clients' connections alive (HTTP/1.1) and forwards each request to moto on a
//! connection of its own, so the function measured behind it makes the calls it makes on
//! AWS; the proxy's work is in its own process's threads, not the function's.
//!
//! It understands what the AWS SDKs send and moto answers: bodies with a
//! `Content-Length` (no chunked uploads).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

/// A running proxy: `endpoint` forwards to the target until the process ends.
pub struct KeepAliveProxy {
    /// `http://127.0.0.1:PORT`, for `AWS_ENDPOINT_URL`.
    pub endpoint: String,
}

impl KeepAliveProxy {
    /// Listens on a free loopback port and forwards to `target` (`host:port`).
    pub fn start(target: SocketAddr) -> KeepAliveProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let endpoint = format!("http://{}", listener.local_addr().expect("proxy address"));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let _ = serve(conn, target);
                });
            }
        });
        KeepAliveProxy { endpoint }
    }
}

/// Serves one client connection: request after request until the client closes it.
fn serve(conn: TcpStream, target: SocketAddr) -> std::io::Result<()> {
    conn.set_nodelay(true)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut writer = conn;
    loop {
        let mut head = Vec::new();
        let mut content_length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
            // moto gets one request per connection, as it serves them.
            if lower.starts_with("connection:") {
                continue;
            }
            head.extend_from_slice(line.as_bytes());
        }
        head.extend_from_slice(b"Connection: close\r\n\r\n");
        let mut body = vec![0u8; content_length];
        reader.read_exact(&mut body)?;

        let mut upstream = TcpStream::connect(target)?;
        upstream.set_nodelay(true)?;
        upstream.write_all(&head)?;
        upstream.write_all(&body)?;
        writer.write_all(&keep_alive(&answer(upstream)?))?;
    }
}

/// moto's answer: to its `Content-Length` (werkzeug closes the connection about 10 ms
/// after the last byte), or to the end of the connection without one.
fn answer(upstream: TcpStream) -> std::io::Result<Vec<u8>> {
    let mut reader = BufReader::new(upstream);
    let mut answer = Vec::new();
    let mut content_length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(answer);
        }
        answer.extend_from_slice(line.as_bytes());
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            content_length = v.trim().parse::<usize>().ok();
        }
    }
    match content_length {
        Some(n) => {
            let start = answer.len();
            answer.resize(start + n, 0);
            reader.read_exact(&mut answer[start..])?;
        }
        None => {
            reader.read_to_end(&mut answer)?;
        }
    }
    Ok(answer)
}

/// moto's answer as an HTTP/1.1 response with a
/// `Content-Length` and without `Connection: close`.
fn keep_alive(answer: &[u8]) -> Vec<u8> {
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let (head, body) = (
        &answer[..split],
        answer.get(split + 4..).unwrap_or_default(),
    );
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("HTTP/1.1 502 Bad Gateway");
    let mut out = format!(
        "HTTP/1.1 {}\r\n",
        status.split_once(' ').map_or("", |s| s.1)
    );
    for line in lines {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:")
            || lower.starts_with("content-length:")
            || lower.starts_with("transfer-encoding:")
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}
