//! gRPC through real sockets: a tonic server on 127.0.0.1:0 serving the health
//! service of tonic-health (a ready-made service, no protoc needed) behind a
//! rate limit layer, and tonic clients for it. Servers stop when their handle
//! drops.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::layer::RateLimitLayer;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

/// What ends a test server: its handle dropped (see [`GrpcServer`]).
type Shutdown = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// `/grpc.health.v1.Health/Check`, the unary method of the health service.
pub const CHECK: &str = "/grpc.health.v1.Health/Check";

/// A tonic server task on a free loopback port.
pub struct GrpcServer {
    addr: SocketAddr,
    /// The PEM certificate a TLS server presents (`None` without TLS).
    tls: Option<String>,
    /// Changes what the health service reports (and so what `Watch` streams).
    pub reporter: HealthReporter,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl GrpcServer {
    /// Serves the health service with `Server::builder().layer(layer)`: the
    /// layer as it is, no body configuration.
    pub async fn start(layer: RateLimitLayer) -> Self {
        Self::serve(layer, None).await
    }

    /// The same over tonic's own TLS (`Server::builder().tls_config`), with a
    /// self-signed certificate for `localhost` made now. Connect with
    /// [`GrpcServer::client`].
    pub async fn start_tls(layer: RateLimitLayer) -> Self {
        let cert = self_signed();
        let identity = (cert.cert.pem(), cert.signing_key.serialize_pem());
        Self::serve(layer, Some(identity)).await
    }

    /// Over TLS that the application terminates itself, as servers that reload
    /// certificates or pick them by SNI do: tokio-rustls streams handed to
    /// `serve_with_incoming`. Each request then carries only
    /// `TlsConnectInfo<TcpConnectInfo>`, no `TcpConnectInfo`.
    pub async fn start_tls_incoming(layer: RateLimitLayer) -> Self {
        use tokio_rustls::TlsAcceptor;
        use tokio_rustls::rustls::ServerConfig;
        use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

        let cert = self_signed();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(std::sync::Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("server certificate");
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = TlsAcceptor::from(std::sync::Arc::new(config));

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (streams, incoming) = tokio::sync::mpsc::channel(16);
        let accepting = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let streams = streams.clone();
                tokio::spawn(async move {
                    let tls = acceptor.accept(tcp).await;
                    let _ = streams.send(tls).await;
                });
            }
        });
        let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
        let (reporter, health) = tonic_health::server::health_reporter();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .layer(layer)
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            accepting.abort();
        });
        GrpcServer {
            addr,
            tls: Some(cert.cert.pem()),
            reporter,
            shutdown: Some(tx),
            task,
        }
    }

    async fn serve(layer: RateLimitLayer, identity: Option<(String, String)>) -> Self {
        let mut builder = Server::builder();
        if let Some((cert, key)) = &identity {
            let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
            builder = builder.tls_config(tls).expect("server TLS configuration");
        }
        let cert = identity.map(|(cert, _)| cert);
        Self::spawn(cert, |health, incoming, shutdown| async move {
            let _ = builder
                .layer(layer)
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
        })
        .await
    }

    /// The health service as an axum router (tonic's
    /// `Routes::into_axum_router`) behind `layer` (made with
    /// `RateLimitLayer::axum_body`), served by tonic's server: the layer's
    /// responses keep axum's `Body`.
    #[cfg(feature = "axum")]
    pub async fn start_axum(layer: tollgate::layer::AxumRateLimitLayer) -> Self {
        Self::spawn(None, |health, incoming, shutdown| async move {
            let router = tonic::service::Routes::new(health)
                .into_axum_router()
                .layer(layer);
            let _ = Server::builder()
                .add_routes(tonic::service::Routes::from(router))
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
        })
        .await
    }

    /// Like [`start`](Self::start), with a [`Probe`] between the rate limit
    /// layer and the health service, so clients see in the metadata what
    /// the service saw in its request extensions.
    pub async fn start_probed(layer: RateLimitLayer) -> Self {
        Self::spawn(None, |health, incoming, shutdown| async move {
            // The first layer added is the outer one: the probe runs inside.
            let _ = Server::builder()
                .layer(layer)
                .layer(tower::layer::layer_fn(Probe))
                .add_service(health)
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await;
        })
        .await
    }

    /// Binds a free loopback port and runs `serve(health, incoming,
    /// shutdown)` in a task: the health service, the port's connections, and
    /// what ends the server when its handle drops. `tls`: the certificate the
    /// server presents, if it serves TLS.
    async fn spawn<F, Fut>(tls: Option<String>, serve: F) -> Self
    where
        F: FnOnce(HealthServer<HealthService>, TcpIncoming, Shutdown) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let reporter = HealthReporter::new();
        let health = HealthServer::new(HealthService::from_health_reporter(reporter.clone()));
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = Box::pin(async move {
            let _ = rx.await;
        });
        let task = tokio::spawn(serve(health, TcpIncoming::from(listener), shutdown));
        GrpcServer {
            addr,
            tls,
            reporter,
            shutdown: Some(tx),
            task,
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A health client on a new HTTP/2 connection (over TLS to a TLS server,
    /// trusting its certificate).
    pub async fn client(&self) -> HealthClient<Channel> {
        match &self.tls {
            None => HealthClient::new(channel(self.addr).await),
            Some(cert) => HealthClient::new(tls_channel(self.addr, cert).await),
        }
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        // Graceful shutdown waits for open streams; a test is done with them.
        self.task.abort();
    }
}

/// An HTTP/2 connection to `addr` (a tonic or an axum server).
pub async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to the test server")
}

/// A self-signed certificate and key for `localhost`.
fn self_signed() -> rcgen::CertifiedKey<rcgen::KeyPair> {
    rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .expect("self-signed certificate")
}

/// An HTTP/2 connection over TLS to `addr`, trusting `cert` for `localhost`.
pub async fn tls_channel(addr: SocketAddr, cert: &str) -> Channel {
    let tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(cert));
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("endpoint")
        .tls_config(tls)
        .expect("client TLS configuration")
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("TLS connection to the test server")
}

/// A `Check` request for the whole server, with `metadata` added.
pub fn check(metadata: &[(&'static str, &str)]) -> tonic::Request<HealthCheckRequest> {
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    for (name, value) in metadata {
        req.metadata_mut()
            .insert(*name, value.parse().expect("ASCII metadata value"));
    }
    req
}

/// Awaits a call, failing the test after 30 s instead of hanging.
pub async fn within<F: Future>(call: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("answer within 30 s")
}

/// One metadata value as text.
pub fn meta<'a>(metadata: &'a tonic::metadata::MetadataMap, name: &str) -> Option<&'a str> {
    metadata.get(name).and_then(|v| v.to_str().ok())
}

/// `grpc-retry-pushback-ms` of a status, parsed.
pub fn pushback(status: &tonic::Status) -> Option<i64> {
    meta(status.metadata(), "grpc-retry-pushback-ms").map(|v| v.parse().expect("integer ms"))
}

/// Response metadata set by [`Probe`]: `allowed=<bool> remaining=<n> limit=<n>`
/// of the `Decision` in the request extensions.
pub const PROBE_DECISION: &str = "x-probe-decision";
/// Response metadata set by [`Probe`]: the `StoreFailure` in the request
/// extensions, as text.
pub const PROBE_STORE_FAILURE: &str = "x-probe-store-failure";

/// A service wrapper that copies what the rate limit layer put into the
/// request extensions (a `Decision`, a `StoreFailure`) into response
/// metadata ([`PROBE_DECISION`], [`PROBE_STORE_FAILURE`]): a gRPC client
/// cannot see extensions, and without this a call the layer forwarded would
/// look the same as a call with no layer at all.
#[derive(Clone, Debug)]
pub struct Probe<S>(pub S);

impl<S, B, RB> tower::Service<http::Request<B>> for Probe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send + 'static>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let decision = req.extensions().get::<tollgate::Decision>().map(|d| {
            format!(
                "allowed={} remaining={} limit={}",
                d.allowed(),
                d.remaining(),
                d.limit()
            )
        });
        let failure = req
            .extensions()
            .get::<tollgate::layer::StoreFailure>()
            .map(|f| f.to_string());
        let future = self.0.call(req);
        Box::pin(async move {
            let mut res = future.await?;
            for (name, value) in [(PROBE_DECISION, decision), (PROBE_STORE_FAILURE, failure)] {
                if let Some(value) = value.and_then(|v| http::HeaderValue::from_str(&v).ok()) {
                    res.headers_mut().insert(name, value);
                }
            }
            Ok(res)
        })
    }
}
