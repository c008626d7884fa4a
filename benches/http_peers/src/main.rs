//! `peer-server LIMITER [CASE]`: serves `GET /` (a 2-byte body) with axum 0.8 on
//! 127.0.0.1:$PORT behind one rate limiter, keyed by the `x-client` header, for
//! `benches/http_peers.sh`.
//!
//! - LIMITER: `none`, `governor` (tower_governor, in memory), `trlr`
//!   (tower-rate-limit-redis), `tollgate-memory`, `tollgate-redis`.
//! - CASE: `open` (default; every request is admitted) or `hot` (burst 10,
//!   refilled 1 per second: a flooded key is nearly always denied).
//! - Environment: `PORT` (default 3000), `REDIS_URL` (default
//!   `redis://127.0.0.1:6379`) for the Redis-backed limiters.
//!
//! Every variant runs on the same multi-thread tokio runtime with 2 workers and
//! the same router; only the layer differs. See README.md for each limiter's
//! algorithm and configuration.

use std::error::Error;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Response, StatusCode};
use axum::routing::get;

type BoxError = Box<dyn Error + Send + Sync>;

/// The header every limiter keys by.
const KEY_HEADER: &str = "x-client";

/// What the quota is meant to do; each limiter expresses it as closely as it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Every request admitted: 1 000 000 per second per key (or the largest
    /// quota the limiter supports), so each request costs one decision that admits.
    Open,
    /// Burst 10, refilled 1 per second: a flooded key is nearly always denied (429).
    Hot,
}

// ---------------------------------------------------------------------------
// tollgate: EVERY tollgate-specific line of the server is in this module.
// When tollgate's API changes, only this module needs updating.
// ---------------------------------------------------------------------------
mod tollgate_limiter {
    use axum::Router;
    use tollgate::key::Header;
    use tollgate::layer::{OnStoreError, RateLimitLayer};
    use tollgate::{MemoryStore, Quota, RedisStore};

    use super::{BoxError, Case, KEY_HEADER};

    fn quota(case: Case) -> Result<Quota, BoxError> {
        Ok(match case {
            Case::Open => Quota::per_second(1_000_000)?,
            Case::Hot => Quota::per_second(1)?.burst(10)?,
        })
    }

    /// Puts tollgate in front of `router`: in memory, or in Redis at `redis_url`.
    /// Store errors answer 503 (not the default fail-open) so a broken Redis shows
    /// up as non-2xx responses instead of as free throughput.
    pub(crate) fn layer(
        router: Router,
        case: Case,
        redis_url: Option<&str>,
    ) -> Result<Router, BoxError> {
        let key = Header::new(KEY_HEADER).verbatim();
        let quota = quota(case)?;
        Ok(match redis_url {
            None => router.layer(
                RateLimitLayer::new(MemoryStore::new(), quota)
                    .key(key)
                    .on_store_error(OnStoreError::Deny),
            ),
            Some(url) => router.layer(
                RateLimitLayer::new(RedisStore::from_url(url)?, quota)
                    .key(key)
                    .on_store_error(OnStoreError::Deny),
            ),
        })
    }
}
// ---------------------------------------------------------------------------

/// tower_governor: GCRA in process memory (governor's keyed DashMap state).
mod governor_limiter {
    use std::time::Duration;

    use axum::Router;
    use axum::http::Request;
    use tower_governor::GovernorError;
    use tower_governor::GovernorLayer;
    use tower_governor::governor::GovernorConfigBuilder;
    use tower_governor::key_extractor::KeyExtractor;

    use super::{BoxError, Case, KEY_HEADER};

    #[derive(Clone)]
    struct ClientHeader;

    impl KeyExtractor for ClientHeader {
        type Key = String;

        fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
            req.headers()
                .get(KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .ok_or(GovernorError::UnableToExtractKey)
        }
    }

    pub(crate) fn layer(router: Router, case: Case) -> Result<Router, BoxError> {
        // governor: one token every `period`, at most `burst` at once.
        let (period, burst) = match case {
            // 1 000 000 per second, burst 1 000 000.
            Case::Open => (Duration::from_micros(1), 1_000_000),
            Case::Hot => (Duration::from_secs(1), 10),
        };
        let config = GovernorConfigBuilder::default()
            .period(period)
            .burst_size(burst)
            .key_extractor(ClientHeader)
            .finish()
            .ok_or("governor: zero period or burst")?;
        Ok(router.layer(GovernorLayer::new(config)))
    }
}

/// tower-rate-limit-redis: GCRA in a Lua script, over one multiplexed connection.
mod trlr_limiter {
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, Response, StatusCode};
    use tower_rate_limit_redis::{KeyResolver, RateLimitLayer};

    use super::{BoxError, Case, KEY_HEADER};

    #[derive(Clone)]
    struct ClientHeader;

    impl KeyResolver for ClientHeader {
        type Key = String;
        type ErrorBody = Body;

        fn key<T>(&self, req: &Request<T>) -> Result<String, Response<Body>> {
            match req.headers().get(KEY_HEADER).and_then(|v| v.to_str().ok()) {
                // A prefix, as tollgate's keys have one.
                Some(v) => Ok(format!("trlr:{v}")),
                None => Err(super::status(StatusCode::BAD_REQUEST)),
            }
        }
    }

    pub(crate) async fn layer(router: Router, case: Case, url: &str) -> Result<Router, BoxError> {
        // capacity is a u16 and the emission interval whole milliseconds (>= 1 ms):
        // the largest quota it can express is 1000 per second with a burst of 65 535.
        let (capacity, interval) = match case {
            Case::Open => (u16::MAX, Duration::from_millis(1)),
            Case::Hot => (10, Duration::from_secs(1)),
        };
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let layer = RateLimitLayer::builder()
            .conn(conn)
            .key_resolver(ClientHeader)
            .capacity(capacity)
            .emission_interval(interval)
            // Like tollgate's default timeout; errors answer 500 (fail closed).
            .timeout(Duration::from_millis(100))
            .build();
        Ok(router.layer(layer))
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = code;
    res
}

fn usage() -> BoxError {
    "usage: peer-server none|governor|trlr|tollgate-memory|tollgate-redis [open|hot] \
     (env PORT, REDIS_URL)"
        .into()
}

async fn run() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let limiter = args.next().ok_or_else(usage)?;
    let case = match args.next().as_deref() {
        None | Some("open") => Case::Open,
        Some("hot") => Case::Hot,
        Some(_) => return Err(usage()),
    };
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse().map_err(|e| format!("PORT={p:?}: {e}"))?,
        Err(_) => 3000,
    };
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());

    let router = Router::new().route("/", get(|| async { "ok" }));
    let router = match limiter.as_str() {
        "none" => router,
        "governor" => governor_limiter::layer(router, case)?,
        "trlr" => trlr_limiter::layer(router, case, &redis_url).await?,
        "tollgate-memory" => tollgate_limiter::layer(router, case, None)?,
        "tollgate-redis" => tollgate_limiter::layer(router, case, Some(&redis_url))?,
        _ => return Err(usage()),
    };

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    eprintln!("peer-server: {limiter} ({case:?}) on http://{addr}");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(run()) {
        eprintln!("peer-server: {e}");
        std::process::exit(1);
    }
    // Do not wait for detached blocking tasks.
    runtime.shutdown_timeout(Duration::from_secs(1));
}
