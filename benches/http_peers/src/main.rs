//! `peer-server LIMITER [CASE]`: serves `GET /` (a 2-byte body) with axum 0.8 on
//! 127.0.0.1:$PORT behind one rate limiter, keyed by the `x-client` header, for
//! `benches/http_peers.sh`.
//!
//! - LIMITER: `none`, `governor` (tower_governor, in memory),
//!   `governor-headers` (the same with `use_headers()`: `x-ratelimit-limit`
//!   and `x-ratelimit-remaining` on admitted responses), `trlr`
//!   (tower-rate-limit-redis), `tollgate-memory`, `tollgate-redis` (leases
//!   off: every check goes to Redis), the same
//!   two without rate limit headers (`tollgate-memory-bare`,
//!   `tollgate-redis-bare`: `HeaderStyle::None`, as the peers send none on
//!   admitted responses), `tollgate-redis-leased` and
//!   `tollgate-redis-leased-bare` (as `tollgate-redis` and
//!   `tollgate-redis-bare`, over a RedisStore with leases on; on SIGTERM they
//!   print the store's lease stats to stderr and exit), or
//!   `tollgate-redis-outage` for `benches/outage.sh`: tollgate with a
//!   RedisStore (300 ms store timeout, default circuit breaker, checked with
//!   `ping` at start-up) and the store-error policy named by `ON_STORE_ERROR`
//!   (`allow`, the default, `deny`, `fallback`: `Fallback::memory()`, or
//!   `default`: the layer's own default, `on_store_error` not called), with
//!   leases as `LEASES` says (`1`: on, `lease_period` from `LEASE_PERIOD_MS`,
//!   else the default; `0`: off; unset: the builder's default, on). It also records who decided each response and how long
//!   the server took, per 10 ms (see `mod timeline`), served unlimited at
//!   `GET /timeline`; with leases on, also the checks decided in process from
//!   a lease (sampled from the store's lease stats every 10 ms).
//! - CASE: `open` (default; every request is admitted) or `hot` (burst 10,
//!   refilled 1 per second: a flooded key is nearly always denied).
//! - Environment: `PORT` (default 3000), `REDIS_URL` (default
//!   `redis://127.0.0.1:6379`) for the Redis-backed limiters.
//!
//! Every variant runs on the same multi-thread tokio runtime with 2 workers and
//! the same router; only the layer differs. See README.md for each limiter's
//! algorithm and configuration.
//!
//! `peer-server delay-proxy LISTEN_PORT UPSTREAM_PORT DELAY_US` is not a
//! server but the "far" Redis of `benches/far_redis.sh`: a TCP proxy on
//! 127.0.0.1:LISTEN_PORT to 127.0.0.1:UPSTREAM_PORT that holds every chunk
//! DELAY_US microseconds in each direction, until killed (see
//! `mod delay_proxy`; no tokio runtime, no limiter).

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

/// The harness's delay line, for `delay-proxy`.
#[allow(
    dead_code,
    reason = "the proxy passes every chunk on: no fault injection"
)]
#[path = "../../../tests/support/delay_line.rs"]
mod delay_line;

// ---------------------------------------------------------------------------
// tollgate: EVERY tollgate-specific line of the server is in this module.
// When tollgate's API changes, only this module needs updating.
// ---------------------------------------------------------------------------
mod tollgate_limiter {
    use std::time::Duration;

    use axum::Router;
    use axum::http::Response;
    use tollgate::key::Header;
    use tollgate::layer::{HeaderStyle, OnStoreError, RateLimitLayer, StoreFailure};
    use tollgate::store::CircuitBreaker;
    use tollgate::{Decision, Fallback, MemoryStore, Quota, RedisStore};

    use super::timeline::Source;
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
    ///
    /// `bare`: no rate limit headers (`HeaderStyle::None`) instead of the
    /// default IETF `RateLimit` headers. Responses keep axum's `Body`
    /// (`axum_body()`), as tower_governor's do.
    pub(crate) fn layer(
        router: Router,
        case: Case,
        redis_url: Option<&str>,
        bare: bool,
    ) -> Result<Router, BoxError> {
        let headers = if bare {
            HeaderStyle::None
        } else {
            HeaderStyle::Ietf
        };
        let key = Header::new(KEY_HEADER)
            .expect("a valid header name")
            .verbatim();
        let quota = quota(case)?;
        Ok(match redis_url {
            None => router.layer(
                RateLimitLayer::new(MemoryStore::new(), quota)
                    .key(key)
                    .headers(headers)
                    .on_store_error(OnStoreError::Deny)
                    .axum_body(),
            ),
            Some(url) => router.layer(
                RateLimitLayer::new(RedisStore::builder().url(url).leases(false).build()?, quota)
                    .key(key)
                    .headers(headers)
                    .on_store_error(OnStoreError::Deny)
                    .axum_body(),
            ),
        })
    }

    /// `tollgate-redis-leased[-bare]`: as [`layer`] over Redis at
    /// `redis_url`, with leases on (`RedisStore::builder().url(..).leases(true)`,
    /// the default lease period and keys; everything else as `from_url`).
    /// Returns the store too, for its lease stats. Unlike `layer`, it builds
    /// only against an API with leases.
    pub(crate) fn leased_layer(
        router: Router,
        case: Case,
        redis_url: &str,
        bare: bool,
    ) -> Result<(Router, RedisStore), BoxError> {
        let headers = if bare {
            HeaderStyle::None
        } else {
            HeaderStyle::Ietf
        };
        let store = RedisStore::builder().url(redis_url).leases(true).build()?;
        let layer = RateLimitLayer::new(store.clone(), quota(case)?)
            .key(
                Header::new(KEY_HEADER)
                    .expect("a valid header name")
                    .verbatim(),
            )
            .headers(headers)
            .on_store_error(OnStoreError::Deny)
            .axum_body();
        Ok((router.layer(layer), store))
    }

    /// On SIGTERM (how the benchmark scripts stop the server): prints the
    /// store's lease stats since start-up as one line on stderr,
    /// `peer-server: leases: local_decisions=N requests=N granted=N spent=N
    /// returned=N expired=N outstanding=N held=N`, and exits. Registered
    /// before serving; only the leased variants install it.
    pub(crate) fn lease_stats_on_exit(store: RedisStore) -> Result<(), BoxError> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::spawn(async move {
            term.recv().await;
            let s = store.lease_stats();
            eprintln!(
                "peer-server: leases: local_decisions={} requests={} granted={} spent={} \
                 returned={} expired={} outstanding={} held={}",
                s.local_decisions,
                s.requests,
                s.granted,
                s.spent,
                s.returned,
                s.expired,
                s.outstanding,
                s.held
            );
            std::process::exit(0);
        });
        Ok(())
    }

    /// The store timeout of the outage benchmark (the "measured today"
    /// set-up).
    const OUTAGE_TIMEOUT: Duration = Duration::from_millis(300);

    /// For `benches/outage.sh`: tollgate over a RedisStore with a 300 ms store
    /// timeout and the default circuit breaker, checked with `ping` first, and
    /// the store-error policy `on_error` (`allow`, `deny`, `fallback`, or
    /// `default`: `on_store_error` is not called).
    ///
    /// For experiments, these environment variables change the defaults:
    /// `BREAKER_FIRST_PROBE_MS`, `BREAKER_MAX_COOLDOWN_MS`, `CONNECT_TIMEOUT_MS`,
    /// and `LEASES` (`1`: leases on, `LEASE_PERIOD_MS` their period, else the
    /// default; `0`: off). Without them the builder is given the URL and the
    /// timeout only (leases on, the default). With leases on, also returns a
    /// [`LeaseProbe`] on the store.
    pub(crate) async fn outage_layer(
        router: Router,
        case: Case,
        redis_url: &str,
        on_error: &str,
    ) -> Result<(Router, Option<LeaseProbe>), BoxError> {
        #[allow(
            deprecated,
            reason = "the variant set_on_store_error takes, as `.fallback` sets it"
        )]
        let on_error = match on_error {
            "allow" => Some(OnStoreError::Allow),
            "deny" => Some(OnStoreError::Deny),
            "fallback" => Some(OnStoreError::Fallback(Fallback::memory())),
            "default" => None,
            other => {
                return Err(
                    format!("ON_STORE_ERROR={other:?}: allow, deny, fallback or default").into(),
                );
            }
        };
        let ms = |name: &str| -> Result<Option<Duration>, BoxError> {
            match std::env::var(name) {
                Ok(v) => Ok(Some(Duration::from_millis(
                    v.parse().map_err(|e| format!("{name}={v:?}: {e}"))?,
                ))),
                Err(_) => Ok(None),
            }
        };
        let mut breaker = CircuitBreaker::new();
        let first_probe = ms("BREAKER_FIRST_PROBE_MS")?;
        let max_cooldown = ms("BREAKER_MAX_COOLDOWN_MS")?;
        if let Some(d) = first_probe {
            breaker = breaker.first_probe(d);
        }
        if let Some(d) = max_cooldown {
            breaker = breaker.max_cooldown(d);
        }
        let mut builder = RedisStore::builder().url(redis_url).timeout(OUTAGE_TIMEOUT);
        if first_probe.is_some() || max_cooldown.is_some() {
            builder = builder.circuit_breaker(breaker);
        }
        if let Some(d) = ms("CONNECT_TIMEOUT_MS")? {
            builder = builder.connect_timeout(d);
        }
        // `LEASES` unset (the default configuration's rows): the builder's
        // default, leases on.
        let leases = match std::env::var("LEASES").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            Ok(other) => return Err(format!("LEASES={other:?}: 0 or 1").into()),
            Err(_) => true,
        };
        let lease_period = ms("LEASE_PERIOD_MS")?;
        if std::env::var_os("LEASES").is_some() {
            builder = builder.leases(leases);
        }
        if leases && let Some(d) = lease_period {
            builder = builder.lease_period(d);
        }
        let store = builder.build()?;
        eprintln!("peer-server: {store:?}, {breaker:?}");
        let probe = leases.then(|| {
            let period = lease_period.unwrap_or(tollgate::store::DEFAULT_LEASE_PERIOD);
            eprintln!("peer-server: leases on, lease period {period:?}");
            LeaseProbe {
                store: store.clone(),
                period,
            }
        });
        let rtt = store.ping().await?;
        eprintln!(
            "peer-server: Redis at {} answered PING in {rtt:?}",
            store.host()
        );
        let key = Header::new(KEY_HEADER)
            .expect("a valid header name")
            .verbatim();
        // `decided_by` reads the decision in the response extensions.
        let layer = RateLimitLayer::new(store, quota(case)?)
            .key(key)
            .decision_in_response();
        let router = router.layer(match on_error {
            Some(policy) => layer.on_store_error(policy),
            None => layer,
        });
        Ok((router, probe))
    }

    /// The outage server's store with leases on, for the timeline: how many
    /// checks it decided in process from a lease so far, and its lease stats.
    pub(crate) struct LeaseProbe {
        store: RedisStore,
        period: Duration,
    }

    impl LeaseProbe {
        /// Checks decided in process from held tokens since start-up.
        pub(crate) fn local_decisions(&self) -> u64 {
            self.store.lease_stats().local_decisions
        }

        /// The lease period, in ms.
        pub(crate) fn period_ms(&self) -> u128 {
            self.period.as_millis()
        }

        /// The store's lease stats now, as `lease_NAME=N` fields.
        pub(crate) fn fields(&self) -> String {
            let s = self.store.lease_stats();
            format!(
                "lease_local_decisions={} lease_requests={} lease_granted={} lease_spent={} \
                 lease_returned={} lease_expired={} lease_outstanding={} lease_held={}",
                s.local_decisions,
                s.requests,
                s.granted,
                s.spent,
                s.returned,
                s.expired,
                s.outstanding,
                s.held
            )
        }
    }

    /// Who decided the request `res` answers: Redis, the fallback, or nobody
    /// (the store failed and the policy allowed or denied without a decision).
    pub(crate) fn decided_by<B>(res: &Response<B>) -> Source {
        let ext = res.extensions();
        if ext.get::<Decision>().is_some_and(Decision::is_fallback) {
            Source::Fallback
        } else if ext.get::<StoreFailure>().is_some() {
            Source::Failed
        } else {
            Source::Store
        }
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

    /// `headers`: `use_headers()`, governor's rate limit headers on admitted
    /// responses (`x-ratelimit-limit`, `x-ratelimit-remaining`), to compare
    /// with tollgate's default headers.
    pub(crate) fn layer(router: Router, case: Case, headers: bool) -> Result<Router, BoxError> {
        // governor: one token every `period`, at most `burst` at once.
        let (period, burst) = match case {
            // 1 000 000 per second, burst 1 000 000.
            Case::Open => (Duration::from_micros(1), 1_000_000),
            Case::Hot => (Duration::from_secs(1), 10),
        };
        let mut builder = GovernorConfigBuilder::default()
            .period(period)
            .burst_size(burst)
            .key_extractor(ClientHeader);
        let missing = "governor: zero period or burst";
        Ok(if headers {
            let config = builder.use_headers().finish().ok_or(missing)?;
            router.layer(GovernorLayer::new(config))
        } else {
            let config = builder.finish().ok_or(missing)?;
            router.layer(GovernorLayer::new(config))
        })
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

/// Counts of answers per 10 ms slot, by who decided them and by status, and
/// how long the server took (from this middleware receiving the request to the
/// response), for `benches/outage.sh`: it tells when decisions stopped and
/// resumed coming from Redis, what the fallback admitted, and which requests
/// waited on the store, for every request the server answered (also those wrk
/// leaves uncounted between its runs). With leases on, also how many checks
/// the store decided in process from a lease: such a decision is a plain
/// `Decision` (counted as the store's), so the count comes from the store's
/// lease stats, sampled every slot.
mod timeline {
    use std::fmt::Write as _;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use axum::extract::Request;
    use axum::http::StatusCode;
    use axum::middleware::Next;
    use axum::response::Response;

    use super::tollgate_limiter::LeaseProbe;

    /// Slot length in milliseconds.
    const SLOT_MS: u64 = 10;
    /// Ten minutes of slots; later answers count in the last one.
    const SLOTS: usize = 60_000;
    /// Upper bounds (ms) of the server-time buckets; the last bucket is
    /// everything above the last bound (250 ms: close to the store timeout).
    const BOUNDS_MS: [u64; 8] = [1, 2, 5, 10, 20, 50, 100, 250];
    /// Counters per slot: 3 sources x 3 status classes, then 9 time buckets,
    /// then the checks decided from a lease (with leases on).
    const PER_SLOT: usize = 9 + BOUNDS_MS.len() + 1 + 1;
    /// Where a slot's lease count is.
    const LEASE: usize = PER_SLOT - 1;

    /// Who decided an answer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Source {
        /// The store (Redis).
        Store = 0,
        /// The in-process fallback, while the store failed.
        Fallback = 1,
        /// Nobody: the store failed and the layer forwarded or denied.
        Failed = 2,
    }

    struct Timeline {
        start: Instant,
        start_unix_ms: u64,
        counts: Box<[AtomicU64]>,
    }

    static TIMELINE: OnceLock<Timeline> = OnceLock::new();
    /// The store's leases, when on.
    static LEASES: OnceLock<LeaseProbe> = OnceLock::new();

    fn timeline() -> &'static Timeline {
        TIMELINE.get_or_init(|| Timeline {
            start: Instant::now(),
            start_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            counts: (0..SLOTS * PER_SLOT).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Starts the clock (call once at start-up, before serving), and with
    /// leases on (`leases`), a task that adds the checks decided from a lease
    /// since its last look to the slot it looks in, every slot (a count is
    /// late by up to a slot, or by as long as the runtime delays the task).
    pub(crate) fn start(leases: Option<LeaseProbe>) {
        let t = timeline();
        let Some(probe) = leases else {
            return;
        };
        let probe = LEASES.get_or_init(|| probe);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(SLOT_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seen = probe.local_decisions();
            loop {
                tick.tick().await;
                let now = probe.local_decisions();
                let base = slot_now(t) * PER_SLOT;
                t.counts[base + LEASE].fetch_add(now.saturating_sub(seen), Ordering::Relaxed);
                seen = now;
            }
        });
    }

    fn slot_now(t: &Timeline) -> usize {
        ((t.start.elapsed().as_millis() as u64 / SLOT_MS) as usize).min(SLOTS - 1)
    }

    /// Counts one answer now, which took the server `took`.
    pub(crate) fn record(source: Source, status: StatusCode, took: Duration) {
        let t = timeline();
        let slot = slot_now(t);
        let class = if status.is_success() {
            0
        } else if status == StatusCode::TOO_MANY_REQUESTS {
            1
        } else {
            2
        };
        let base = slot * PER_SLOT;
        t.counts[base + source as usize * 3 + class].fetch_add(1, Ordering::Relaxed);
        let ms = took.as_millis() as u64;
        let bucket = BOUNDS_MS
            .iter()
            .position(|&b| ms < b)
            .unwrap_or(BOUNDS_MS.len());
        t.counts[base + 9 + bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// `GET /timeline`: a header line, then one line per non-empty slot:
    /// `unix_ms store_2xx store_429 store_other fallback_2xx fallback_429
    /// fallback_other failed_2xx failed_429 failed_other`, then the answers
    /// that took the server less than 1, 2, 5, 10, 20, 50, 100, 250 ms and
    /// longer (unix_ms: the slot's start, by the system clock, as
    /// `date +%s%3N`). With leases on, the header also has `lease_period_ms`
    /// and the store's lease stats now (`lease_local_decisions=N` etc.), and
    /// each line ends with one more count: the checks decided in process from
    /// a lease, as sampled in that slot (they are among the slot's `store_2xx`
    /// answers, give or take a slot).
    pub(crate) async fn dump() -> String {
        let t = timeline();
        let leases = LEASES.get();
        let mut out = format!(
            "# slot_ms={SLOT_MS} start_unix_ms={} time_bounds_ms={}",
            t.start_unix_ms,
            BOUNDS_MS.map(|b| b.to_string()).join(",")
        );
        if let Some(probe) = leases {
            let _ = write!(
                out,
                " lease_period_ms={} {}",
                probe.period_ms(),
                probe.fields()
            );
        }
        out.push('\n');
        let columns = if leases.is_some() { PER_SLOT } else { LEASE };
        for (i, slot) in t.counts.chunks(PER_SLOT).enumerate() {
            let c: Vec<u64> = slot[..columns]
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect();
            if c.iter().all(|&n| n == 0) {
                continue;
            }
            let _ = write!(out, "{}", t.start_unix_ms + i as u64 * SLOT_MS);
            for n in c {
                let _ = write!(out, " {n}");
            }
            out.push('\n');
        }
        out
    }

    /// The middleware: counts each response by who decided it and how long
    /// the server took.
    pub(crate) async fn count(req: Request, next: Next) -> Response {
        let started = Instant::now();
        let res = next.run(req).await;
        record(
            super::tollgate_limiter::decided_by(&res),
            res.status(),
            started.elapsed(),
        );
        res
    }
}

/// `peer-server delay-proxy LISTEN_PORT UPSTREAM_PORT DELAY_US`: a TCP proxy
/// that holds every chunk `DELAY_US` µs in each direction, for
/// `benches/far_redis.sh` ("Redis far away" on one machine). It runs the
/// delay line of the test harness's `Proxy` (`tests/support/delay_line.rs`,
/// included here), without its fault injection, on plain threads so that a hold is as precise as
/// `std::thread::sleep` (an event loop's millisecond timer would round
/// 0.5 ms up to 1 or 2 ms):
///
/// - it listens on 127.0.0.1 only and connects each accepted connection to
///   127.0.0.1:UPSTREAM_PORT, `TCP_NODELAY` on both sockets (as Redis and
///   its clients set it: a small chunk must not wait for the ACK of the
///   previous one);
/// - per connection and direction, a reader thread stamps each chunk it
///   reads with its due time (read time + delay) and a writer thread passes
///   the chunks on in order, each at its time: a delay line, so one chunk's
///   wait does not add to the next one's, and a round trip takes about
///   2 x DELAY_US plus the threads' wake-ups;
/// - when one side closes, the writer passes on what it holds, then shuts
///   the other side down, which ends the other direction too.
///
/// It runs until killed.
mod delay_proxy {
    use std::net::{TcpListener, TcpStream};
    use std::thread;
    use std::time::Duration;

    use super::BoxError;
    use super::delay_line;

    /// Accepts connections on 127.0.0.1:`listen` forever.
    pub(crate) fn run(listen: u16, upstream: u16, delay: Duration) -> Result<(), BoxError> {
        let listener = TcpListener::bind(("127.0.0.1", listen))
            .map_err(|e| format!("cannot bind 127.0.0.1:{listen}: {e}"))?;
        eprintln!(
            "peer-server: delay proxy 127.0.0.1:{listen} -> 127.0.0.1:{upstream}, \
             {delay:?} a chunk each way"
        );
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            thread::spawn(move || relay(client, upstream, delay));
        }
        Ok(())
    }

    /// Connects `client` to the upstream (dropping it if that fails) and
    /// starts a delay line each way.
    fn relay(client: TcpStream, upstream: u16, delay: Duration) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
            return;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        for (from, to) in [
            (client.try_clone(), server.try_clone()),
            (server.try_clone(), client.try_clone()),
        ] {
            if let (Ok(from), Ok(to)) = (from, to) {
                delay_line::spawn(from, to, move || delay, |_| delay_line::Pass::On);
            }
        }
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = code;
    res
}

fn usage() -> BoxError {
    "usage: peer-server none|governor[-headers]|trlr|tollgate-memory[-bare]|tollgate-redis[-bare]|\
     tollgate-redis-leased[-bare]|tollgate-redis-outage \
     [open|hot] (env PORT, REDIS_URL; for the outage variant ON_STORE_ERROR=allow|deny|fallback|default, \
     LEASES=0|1, LEASE_PERIOD_MS)\n\
     \x20      peer-server delay-proxy LISTEN_PORT UPSTREAM_PORT DELAY_US"
        .into()
}

/// `delay-proxy LISTEN_PORT UPSTREAM_PORT DELAY_US` (the arguments after
/// `delay-proxy`): runs the proxy until killed.
fn run_delay_proxy(args: &[String]) -> Result<(), BoxError> {
    let [listen, upstream, delay_us] = args else {
        return Err(usage());
    };
    let number = |name: &str, v: &str| -> Result<u64, BoxError> {
        v.parse().map_err(|e| format!("{name} {v:?}: {e}").into())
    };
    let port = |name: &str, v: &str| -> Result<u16, BoxError> {
        u16::try_from(number(name, v)?).map_err(|e| format!("{name} {v:?}: {e}").into())
    };
    delay_proxy::run(
        port("LISTEN_PORT", listen)?,
        port("UPSTREAM_PORT", upstream)?,
        Duration::from_micros(number("DELAY_US", delay_us)?),
    )
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
        "governor" => governor_limiter::layer(router, case, false)?,
        "governor-headers" => governor_limiter::layer(router, case, true)?,
        "trlr" => trlr_limiter::layer(router, case, &redis_url).await?,
        "tollgate-memory" => tollgate_limiter::layer(router, case, None, false)?,
        "tollgate-memory-bare" => tollgate_limiter::layer(router, case, None, true)?,
        "tollgate-redis" => tollgate_limiter::layer(router, case, Some(&redis_url), false)?,
        "tollgate-redis-bare" => tollgate_limiter::layer(router, case, Some(&redis_url), true)?,
        "tollgate-redis-leased" | "tollgate-redis-leased-bare" => {
            let bare = limiter.ends_with("-bare");
            let (router, store) = tollgate_limiter::leased_layer(router, case, &redis_url, bare)?;
            tollgate_limiter::lease_stats_on_exit(store)?;
            router
        }
        "tollgate-redis-outage" => {
            let on_error = std::env::var("ON_STORE_ERROR").unwrap_or_else(|_| "allow".to_owned());
            let (router, leases) =
                tollgate_limiter::outage_layer(router, case, &redis_url, &on_error).await?;
            // Counted outside the limiter (its 429s and 503s too); /timeline
            // itself is neither limited nor counted.
            timeline::start(leases);
            router
                .layer(axum::middleware::from_fn(timeline::count))
                .route("/timeline", get(timeline::dump))
        }
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
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "delay-proxy") {
        if let Err(e) = run_delay_proxy(&args[1..]) {
            eprintln!("peer-server: {e}");
            std::process::exit(1);
        }
        return;
    }
    // Info and above: breaker transitions, store errors (throttled by
    // tollgate), fallback start and end; never the debug event per decision.
    #[cfg(feature = "trace")]
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(std::io::stderr)
        .init();
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
