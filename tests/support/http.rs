//! HTTP through real sockets: an axum (or bare hyper) server on 127.0.0.1:0 and
//! a small client. Servers stop when their handle drops, so no test leaves one
//! running.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server task on a free loopback port.
pub struct TestServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Serves `app` with the peer address available as `ConnectInfo<SocketAddr>`.
    pub async fn axum(app: axum::Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let service = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, service)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        TestServer {
            addr,
            shutdown: Some(tx),
            task,
        }
    }

    /// Serves a bare tower service (no axum) over hyper's HTTP/1 connection API.
    /// The peer address is put into each request's extensions as a plain
    /// `SocketAddr`, as a bare hyper server does for peer-IP keys.
    pub async fn hyper<S, B>(service: S) -> Self
    where
        S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, mut rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => continue,
                    },
                    _ = &mut rx => return,
                };
                let with_peer = tower::ServiceExt::map_request(
                    service.clone(),
                    move |mut req: Request<Incoming>| {
                        req.extensions_mut().insert(peer);
                        req
                    },
                );
                let service = hyper_util::service::TowerToHyperService::new(with_peer);
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        TestServer {
            addr,
            shutdown: Some(tx),
            task,
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // Graceful shutdown waits for idle keep-alive connections; a test is
        // done with them, so end the task outright.
        self.task.abort();
    }
}

/// One response, read completely.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// A header as text (`None` when absent or not visible ASCII).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every line of a header, joined by `, ` as a list would be.
    pub fn list(&self, name: &str) -> Option<String> {
        let values: Vec<&str> = self
            .headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        (!values.is_empty()).then(|| values.join(", "))
    }

    /// `Retry-After` as delay seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after")
            .map(|v| v.parse().expect("delay-seconds"))
    }
}

/// An HTTP/1 client with keep-alive, for talking to a [`TestServer`].
#[derive(Clone)]
pub struct Client {
    inner: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    pub fn new() -> Self {
        Client {
            inner: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// `GET url` with no extra header.
    pub async fn get(&self, url: &str) -> Reply {
        self.get_with(url, &[]).await
    }

    /// `GET url` with raw header values (any bytes a header may carry).
    pub async fn get_with(&self, url: &str, headers: &[(&str, &[u8])]) -> Reply {
        self.send("GET", url, headers).await
    }

    /// A request of any method, with raw header values and an empty body, over
    /// HTTP/1.1.
    pub async fn send(&self, method: &str, url: &str, headers: &[(&str, &[u8])]) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(url)
            .body(Full::new(Bytes::new()))
            .expect("request");
        for (name, value) in headers {
            req.headers_mut().append(
                HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_bytes(value).expect("header value"),
            );
        }
        let res = tokio::time::timeout(Duration::from_secs(30), self.inner.request(req))
            .await
            .expect("response within 30 s")
            .expect("response");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }
}
