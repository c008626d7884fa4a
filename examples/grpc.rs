//! gRPC: the rate limit layer in front of a tonic server, and a tonic client that
//! calls until it is limited, then reads the gRPC status and the retry hints.
//!
//! ```text
//! cargo run --example grpc --features tonic
//! ```
//!
//! The server is tonic-health's `grpc.health.v1.Health` (a ready-made service,
//! so no protoc is needed) on a free loopback port; the buckets live in memory
//! (use `RedisStore::from_url(...)` to share them between instances). Needs
//! tollgate's `tonic` feature (off by default): it lets the default key read the
//! peer address from tonic's `TcpConnectInfo` and adds the `google.rpc` error
//! details read back below.

use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::layer::RateLimitLayer;
use tollgate::{MemoryStore, Policy, Quota};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Per client address: bursts of 3 calls, then 2 a second.
    // The layer goes on tonic's server as it is: its answers wrap tonic's body.
    let policy = Policy::new("health", [Quota::per_second(2)?.burst(3)?])?;
    let limit = RateLimitLayer::new(MemoryStore::new(), policy);

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(limit)
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    println!("grpc.health.v1.Health on {addr}: bursts of 3 calls, then 2 a second");

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let mut wait = None;
    for n in 1..=10 {
        match client.check(HealthCheckRequest::default()).await {
            Ok(res) => {
                // The RateLimit headers arrive as initial metadata.
                let left = res
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                println!(
                    "call {n}: {:?} (ratelimit: {left})",
                    res.into_inner().status()
                );
            }
            Err(status) => {
                println!("call {n}: limited");
                println!(
                    "  code:      {:?} ({})",
                    status.code(),
                    status.code() as i32
                );
                println!("  message:   {}", status.message());
                let pushback = status
                    .metadata()
                    .get("grpc-retry-pushback-ms")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-");
                println!("  metadata:  grpc-retry-pushback-ms: {pushback}");
                let delay = status
                    .get_details_retry_info()
                    .and_then(|info| info.retry_delay);
                println!("  RetryInfo: retry_delay {delay:?}");
                if let Some(failure) = status.get_details_quota_failure() {
                    for v in failure.violations {
                        println!("  QuotaFailure: {} ({})", v.quota_id, v.description);
                    }
                }
                wait = delay;
                break;
            }
        }
    }
    let Some(wait) = wait else {
        return Err("never limited: the quota should have stopped the fourth call".into());
    };

    // Waiting as told is enough for the next call to pass.
    tokio::time::sleep(wait).await;
    let res = client.check(HealthCheckRequest::default()).await?;
    println!("after waiting {wait:?}: {:?}", res.into_inner().status());

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), server).await???;
    Ok(())
}
