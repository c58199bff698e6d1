//! A small outbound HTTP client: one request at a time, `http://` and `https://` (rustls,
//! the system's root certificates), with a timeout over the whole exchange and a cap on
//! the answer's size. It fetches identity providers' key sets (`auth::jwks`) and drives
//! `airlock check` against a running stage; both are built on the crates the AWS SDK
//! already compiles (hyper, hyper-rustls), so no other HTTP stack is linked.
//!
//! The connector (and the root store) is built on the first request, so a process that
//! never makes one (a worker Lambda) pays nothing at cold start. When the system has no
//! root certificates, `http://` still works and `https://` requests fail saying so.

use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};

type Inner = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// The connector, and why `https://` cannot work when the system's roots did not load.
struct Built {
    client: Inner,
    no_roots: Option<String>,
}

/// An HTTP/1.1 client for `http://` and `https://` URLs. Cheap to create; connections are
/// pooled once the first request has built the connector.
#[derive(Default)]
pub struct HttpClient {
    built: OnceLock<Result<Built, String>>,
}

/// An answer: its status, headers and (capped) body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// A header's value as text (the first one, if sent several times).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// One request. Build it with [`HttpRequest::get`] or [`HttpRequest::post_json`].
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: hyper::Method,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// Over the whole exchange: connecting, sending, and reading the answer.
    pub timeout: Duration,
    /// The largest answer body accepted; a longer one is an error.
    pub max_body: usize,
}

impl HttpRequest {
    pub fn get(url: impl Into<String>) -> HttpRequest {
        HttpRequest {
            method: hyper::Method::GET,
            url: url.into(),
            headers: Vec::new(),
            body: None,
            timeout: Duration::from_secs(10),
            max_body: 1024 * 1024,
        }
    }

    /// A POST of `body` with `Content-Type: application/json` (the body is sent as given,
    /// so a test of malformed JSON can send malformed bytes).
    pub fn post_json(url: impl Into<String>, body: impl Into<Vec<u8>>) -> HttpRequest {
        HttpRequest {
            method: hyper::Method::POST,
            body: Some(body.into()),
            ..HttpRequest::get(url)
        }
        .header("content-type", "application/json")
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> HttpRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> HttpRequest {
        self.timeout = timeout;
        self
    }

    pub fn max_body(mut self, max_body: usize) -> HttpRequest {
        self.max_body = max_body;
        self
    }
}

fn build() -> Result<Built, String> {
    let roots = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(rustls::crypto::aws_lc_rs::default_provider());
    let (builder, no_roots) = match roots {
        Ok(b) => (b, None),
        Err(e) => {
            // No roots: plain http still works; https fails with this reason.
            let config = rustls::ClientConfig::builder_with_provider(
                rustls::crypto::aws_lc_rs::default_provider().into(),
            )
            .with_safe_default_protocol_versions()
            .map(|b| {
                b.with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth()
            });
            let config = config.map_err(|e| format!("TLS configuration: {e}"))?;
            (
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config),
                Some(format!("loading the system's root certificates: {e}")),
            )
        }
    };
    let https = builder.https_or_http().enable_http1().build();
    Ok(Built {
        client: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https),
        no_roots,
    })
}

/// An error with its causes (`client error (Connect): invalid peer certificate: ...`).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl HttpClient {
    pub fn new() -> HttpClient {
        HttpClient::default()
    }

    /// Sends one request and reads its answer, whatever its status. Errors are transport
    /// failures, the timeout, or an answer over the size cap, in words.
    pub async fn send(&self, req: HttpRequest) -> Result<HttpResponse, String> {
        let uri: hyper::Uri = req
            .url
            .parse()
            .map_err(|_| format!("{}: not a URL", req.url))?;
        let built = self
            .built
            .get_or_init(build)
            .as_ref()
            .map_err(|e| e.clone())?;
        if uri.scheme_str() == Some("https") {
            if let Some(why) = &built.no_roots {
                return Err(why.clone());
            }
        }
        let mut b = hyper::Request::builder().method(req.method).uri(uri);
        for (k, v) in &req.headers {
            b = b.header(k.as_str(), v.as_str());
        }
        let request = b
            .body(Full::new(Bytes::from(req.body.unwrap_or_default())))
            .map_err(|e| format!("{}: {e}", req.url))?;
        let max = req.max_body;
        let work = async {
            let resp = built
                .client
                .request(request)
                .await
                .map_err(|e| with_causes(&e))?;
            let status = resp.status().as_u16();
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, max)
                .collect()
                .await
                .map_err(|e| format!("reading the answer (at most {max} bytes): {e}"))?;
            Ok(HttpResponse {
                status,
                headers: parts.headers,
                body: body.to_bytes().to_vec(),
            })
        };
        let secs = req.timeout.as_secs_f64();
        tokio::time::timeout(req.timeout, work)
            .await
            .map_err(|_| format!("no answer within {secs:.1} s"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection server that answers `answer` after reading the request head.
    async fn serve_once(answer: &'static str) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let h = tokio::spawn(async move {
            let (mut c, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = c.read(&mut buf).await.unwrap();
            c.write_all(answer.as_bytes()).await.unwrap();
            buf.truncate(n);
            buf
        });
        (url, h)
    }

    #[tokio::test]
    async fn posts_json_with_headers_and_reads_any_status() {
        let (url, h) = serve_once(
            "HTTP/1.1 422 Unprocessable Entity\r\ncontent-type: application/json\r\nx-request-id: req_1\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{\"ok\":true}",
        )
        .await;
        let r = HttpClient::new()
            .send(HttpRequest::post_json(format!("{url}/x"), "{}").header("x-operator-token", "t"))
            .await
            .unwrap();
        assert_eq!(r.status, 422);
        assert_eq!(r.header("x-request-id"), Some("req_1"));
        assert_eq!(r.body, b"{\"ok\":true}");
        let sent = String::from_utf8(h.await.unwrap()).unwrap().to_lowercase();
        assert!(sent.starts_with("post /x http/1.1"), "{sent}");
        assert!(sent.contains("content-type: application/json"), "{sent}");
        assert!(sent.contains("x-operator-token: t"), "{sent}");
    }

    #[tokio::test]
    async fn caps_the_body_and_times_out() {
        let (url, _h) = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\nconnection: close\r\n\r\n0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789",
        )
        .await;
        let e = HttpClient::new()
            .send(HttpRequest::get(url).max_body(10))
            .await
            .unwrap_err();
        assert!(e.contains("at most 10 bytes"), "{e}");

        // Accepts, never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let _keep = tokio::spawn(async move {
            let (c, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(c);
        });
        let e = HttpClient::new()
            .send(HttpRequest::get(url).timeout(Duration::from_millis(200)))
            .await
            .unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
    }
}
