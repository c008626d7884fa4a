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
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::server::HealthReporter;

/// `/grpc.health.v1.Health/Check`, the unary method of the health service.
pub const CHECK: &str = "/grpc.health.v1.Health/Check";

/// A tonic server task on a free loopback port.
pub struct GrpcServer {
    addr: SocketAddr,
    /// Changes what the health service reports (and so what `Watch` streams).
    pub reporter: HealthReporter,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl GrpcServer {
    /// Serves the health service with `Server::builder().layer(layer)`: the
    /// layer as it is, no body configuration.
    pub async fn start(layer: RateLimitLayer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (reporter, health) = tonic_health::server::health_reporter();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = Server::builder()
                .layer(layer)
                .add_service(health)
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    let _ = rx.await;
                })
                .await;
        });
        GrpcServer {
            addr,
            reporter,
            shutdown: Some(tx),
            task,
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A health client on a new HTTP/2 connection.
    pub async fn client(&self) -> HealthClient<Channel> {
        HealthClient::new(channel(self.addr).await)
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
