//! `airlock serve`'s listener: the router on hyper's HTTP/1.1 connections, with limits on
//! how long a client may take to send a request, so a client that stops half-way holds no
//! connection for good (slowloris):
//!
//! - the request line and headers must arrive within [`ReadTimeouts::headers`], counted
//!   from the first read of an idle connection (a new one, or a kept-alive one between
//!   requests); past it the connection is closed without an answer (hyper's
//!   `header_read_timeout`);
//! - the body must arrive within [`ReadTimeouts::body`] of the headers; past it the read
//!   fails, the request is answered 408 `request_timeout` (by `http::json_errors`, whatever
//!   the handler made of the failed read) and the connection is closed.
//!
//! A Lambda gets whole requests from API Gateway: none of this applies there.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tower::ServiceExt;

/// How long a client may take to send a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadTimeouts {
    /// The request line and headers.
    pub headers: Duration,
    /// The body, from the end of the headers.
    pub body: Duration,
}

impl ReadTimeouts {
    pub fn from_config(c: &crate::config::Config) -> ReadTimeouts {
        ReadTimeouts {
            headers: Duration::from_millis(c.header_read_timeout_ms),
            body: Duration::from_millis(c.body_read_timeout_ms),
        }
    }
}

/// In a request's extensions: whether its body missed its deadline (read by
/// `http::json_errors`).
#[derive(Clone, Debug, Default)]
pub struct BodyDeadline(Arc<AtomicBool>);

impl BodyDeadline {
    pub fn missed(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The body read failed: it did not arrive in time.
#[derive(Debug)]
pub struct BodyReadTimeout;

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyReadTimeout {}

/// A request body with a deadline: data that has arrived is handed on; waiting for more
/// past the deadline fails the read with [`BodyReadTimeout`].
struct DeadlineBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    missed: BodyDeadline,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.missed.0.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(BodyReadTimeout.into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open connections
/// finish their requests (as `axum::serve` with graceful shutdown does).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    timeouts: ReadTimeouts,
    shutdown: impl Future<Output = ()>,
) {
    // Each connection holds a receiver of `stop` (told to finish on shutdown) and of
    // `open` (dropped when it ends): `open_tx.closed()` is every connection ended.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let mut stop = stop_rx.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                let missed = BodyDeadline::default();
                req.extensions_mut().insert(missed.clone());
                let req = req.map(|inner| {
                    Body::new(DeadlineBody {
                        inner,
                        deadline: Box::pin(tokio::time::sleep(timeouts.body)),
                        missed,
                    })
                });
                let app = app.clone();
                async move { app.oneshot(req).await }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(timeouts.headers);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut stopping = false;
            loop {
                tokio::select! {
                    // A header timeout, a reset, a malformed request: the connection ends.
                    _ = conn.as_mut() => break,
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_rx);
    open_tx.closed().await;
}

/// An accept that failed: a connection reset before it was accepted is nothing; anything
/// else (out of file descriptors) is logged and accepting pauses a second, as axum does.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
