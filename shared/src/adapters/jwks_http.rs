//! The JWKS fetcher over HTTPS: the identity providers' keys for [`crate::core::auth::jwks`].

use std::time::Duration;

use async_trait::async_trait;

use crate::core::auth::jwks::JwksFetcher;

/// Fetches over HTTPS (rustls, the system's root certificates), 5 s timeout, 256 KiB cap,
/// with the shared outbound client ([`crate::adapters::http_client`]), which builds its connector
/// on the first fetch, so a function that never sees a token (a worker) pays nothing at
/// cold start.
#[derive(Default)]
pub struct HttpFetcher {
    client: crate::adapters::http_client::HttpClient,
}

const MAX_JWKS_BYTES: usize = 256 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

#[async_trait]
impl JwksFetcher for HttpFetcher {
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, String> {
        use crate::adapters::http_client::HttpRequest;
        url.parse::<hyper::Uri>()
            .map_err(|_| "bad JWKS URL".to_string())?;
        let req = HttpRequest::get(url)
            .header("accept", "application/json")
            .timeout(FETCH_TIMEOUT)
            .max_body(MAX_JWKS_BYTES);
        let resp = self.client.send(req).await.map_err(|e| {
            if e.starts_with("no answer within") {
                "the JWKS URL did not answer within 5 s".to_string()
            } else if e.starts_with("reading the answer") {
                format!("reading the JWKS: {e}")
            } else {
                e
            }
        })?;
        if !(200..300).contains(&resp.status) {
            return Err(format!(
                "the JWKS URL answered {}",
                hyper::StatusCode::from_u16(resp.status)
                    .map_or_else(|_| resp.status.to_string(), |s| s.to_string())
            ));
        }
        Ok(resp.body)
    }
}
