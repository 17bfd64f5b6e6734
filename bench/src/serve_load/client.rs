//! One keep-alive HTTP/1.1 connection to `ps-serve` (hyper's `client::conn::http1` over a tokio `TcpStream`):
//! each load-generator worker owns one and sends its requests one after another on it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where `ps-serve` listens: `http://host:port[/prefix]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL as given, for messages.
    pub url: String,
    /// `host:port`, for resolving and the `Host` header.
    pub authority: String,
    /// Path prefix without a trailing `/` (usually empty).
    pub prefix: String,
}

/// A transport failure (no HTTP answer).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://host[:port][/prefix]`.
    #[error("url {url:?}: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The connection could not be made.
    #[error("cannot connect to {url}")]
    Connect {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (connection closed, protocol error).
    #[error("HTTP exchange with {url} failed")]
    Http {
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// No answer within the timeout.
    #[error("{url}: no answer within {secs} s")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        secs: f64,
    },
}

impl ClientError {
    /// The key this failure is counted under in a report.
    pub fn kind(&self) -> &'static str {
        match self {
            ClientError::Url { .. } | ClientError::Connect { .. } => "connect",
            ClientError::Http { .. } => "io",
            ClientError::Timeout { .. } => "timeout",
        }
    }
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]` (port 80 by default).
    pub fn parse(url: &str) -> Result<Endpoint, ClientError> {
        let bad = |reason: &str| ClientError::Url {
            url: url.into(),
            reason: reason.into(),
        };
        let uri: Uri = url.parse().map_err(|e| bad(&format!("{e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => return Err(bad(&format!("scheme {other}: only http is supported"))),
            None => return Err(bad("no scheme: write http://host:port")),
        }
        let host = uri.host().ok_or_else(|| bad("no host"))?;
        let authority = format!("{host}:{}", uri.port_u16().unwrap_or(80));
        if uri.query().is_some() {
            return Err(bad("a query is not allowed"));
        }
        Ok(Endpoint {
            url: url.trim_end_matches('/').into(),
            authority,
            prefix: uri.path().trim_end_matches('/').into(),
        })
    }

    /// The full path of `route` (`/v1/predict`).
    pub fn path(&self, route: &str) -> String {
        format!("{}{route}", self.prefix)
    }

    /// The first address `authority` resolves to.
    pub async fn resolve(&self) -> Result<SocketAddr, ClientError> {
        let connect = |source| ClientError::Connect {
            url: self.url.clone(),
            source,
        };
        tokio::net::lookup_host(&self.authority)
            .await
            .map_err(connect)?
            .next()
            .ok_or_else(|| {
                connect(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{} resolves to no address", self.authority),
                ))
            })
    }
}

/// One open HTTP/1.1 connection.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    endpoint: Endpoint,
    timeout: Duration,
}

impl Connection {
    /// Opens a connection to `addr` (resolved from `endpoint`); requests time out after `timeout`.
    pub async fn open(
        endpoint: &Endpoint,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Connection, ClientError> {
        let connect = |source| ClientError::Connect {
            url: endpoint.url.clone(),
            source,
        };
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                connect(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {} s", timeout.as_secs_f64()),
                ))
            })?
            .map_err(connect)?;
        stream.set_nodelay(true).map_err(connect)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|source| ClientError::Http {
                url: endpoint.url.clone(),
                source,
            })?;
        // The connection task ends when the sender is dropped or the server closes; its error, if any, is the
        // one the pending request gets.
        tokio::spawn(conn);
        Ok(Connection {
            sender,
            endpoint: endpoint.clone(),
            timeout,
        })
    }

    /// Whether the server closed the connection (a new one is needed).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends `POST {route}` with `body` and returns the status and the whole answer body.
    pub async fn post(
        &mut self,
        route: &str,
        content_type: &str,
        body: Bytes,
    ) -> Result<(u16, Bytes), ClientError> {
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.path(route))
            .header(HOST, &self.endpoint.authority)
            .header(CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .expect("method, path and headers are valid");
        self.send(req).await
    }

    /// Sends `GET {route}` (with its query) and returns the status and the whole answer body.
    pub async fn get(&mut self, route: &str) -> Result<(u16, Bytes), ClientError> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.endpoint.path(route))
            .header(HOST, &self.endpoint.authority)
            .body(Full::new(Bytes::new()))
            .expect("method, path and headers are valid");
        self.send(req).await
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Result<(u16, Bytes), ClientError> {
        let url = &self.endpoint.url;
        let http = |source| ClientError::Http {
            url: url.clone(),
            source,
        };
        let exchange = async {
            self.sender.ready().await.map_err(http)?;
            let resp = self.sender.send_request(req).await.map_err(http)?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map_err(http)?.to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                url: url.clone(),
                secs: self.timeout.as_secs_f64(),
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let e = Endpoint::parse("http://serve:8500").unwrap();
        assert_eq!(e.authority, "serve:8500");
        assert_eq!(e.path("/v1/predict"), "/v1/predict");
        let e = Endpoint::parse("http://10.0.0.1/api/").unwrap();
        assert_eq!(e.authority, "10.0.0.1:80");
        assert_eq!(e.path("/v1/predict"), "/api/v1/predict");
        assert_eq!(e.url, "http://10.0.0.1/api");
        for bad in ["https://x:1", "x:1", "http://x:1/?a=b", "http://"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn messages_name_the_url_and_the_cause_once() {
        let e = ClientError::Connect {
            url: "http://serve:8500".into(),
            source: std::io::Error::other("connection refused"),
        };
        assert_eq!(
            crate::serve_load::report::chain(&e),
            "cannot connect to http://serve:8500: connection refused"
        );
        assert_eq!(e.kind(), "connect");
    }
}
