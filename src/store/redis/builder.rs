//! [`RedisStoreBuilder`]: how a [`RedisStore`] is configured, checked when it
//! is built.

use std::fmt;
use std::time::Duration;

use deadpool_redis::Pool;

use super::connection::Link;
use super::lease::{DEFAULT_LEASE_KEYS, DEFAULT_LEASE_PERIOD, LeaseConfig};
use super::store::{Parts, RedisStore};
#[cfg(feature = "sentinel")]
use super::target::Credentials;
use super::target::{Settings, Target};
use crate::error::ConfigError;
use crate::store::breaker::{Breaker, CircuitBreaker};
use crate::store::deny_cache::DEFAULT_DENY_CACHE;

/// Default key prefix of [`RedisStore`].
pub const DEFAULT_PREFIX: &str = "tollgate:";

/// Default per-call timeout of [`RedisStore`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Default connect timeout of [`RedisStore`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Default largest batch of checks in one script call of [`RedisStore`].
pub const DEFAULT_MAX_BATCH: usize = 32;

/// Configures a [`RedisStore`]; made by [`RedisStore::builder`].
///
/// Setters take the builder by value and never fail; [`build`](Self::build)
/// checks everything at once and reports the first mistake.
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) target: Option<Target>,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    breaker: CircuitBreaker,
    max_batch: usize,
    deny_cache: usize,
    /// `None`: the default (on, but off on a cluster).
    leases: Option<bool>,
    lease_period: Duration,
    lease_keys: usize,
    #[cfg(feature = "tls")]
    root_certificates: Option<Vec<u8>>,
    #[cfg(feature = "sentinel")]
    pub(super) primary_auth: Option<Credentials>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("RedisStoreBuilder");
        f.field("target", &self.target)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("breaker", &self.breaker)
            .field("max_batch", &self.max_batch)
            .field("deny_cache", &self.deny_cache)
            .field("leases", &self.leases)
            .field("lease_period", &self.lease_period)
            .field("lease_keys", &self.lease_keys);
        #[cfg(feature = "tls")]
        f.field("root_certificates", &self.root_certificates.is_some());
        #[cfg(feature = "sentinel")]
        f.field("primary_auth", &self.primary_auth);
        f.finish()
    }
}

impl RedisStore {
    /// A store for the Redis at `url` (`redis://[user:password@]host:port/db`)
    /// with the default settings. Nothing is connected until the first check
    /// (or [`ping`](Self::ping)).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when the URL cannot be parsed; the message shows the
    /// URL without its password.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        Self::builder().url(url).build()
    }

    /// A store over the application's own deadpool-redis pool, with the default
    /// settings. It takes one connection from the pool and keeps it.
    pub fn from_pool(pool: Pool) -> Self {
        match Self::builder().pool(pool).build() {
            Ok(store) => store,
            // The defaults with a pool cannot fail to build.
            Err(e) => unreachable!("{e}"),
        }
    }

    /// A builder to change the defaults: prefix ([`DEFAULT_PREFIX`]), call
    /// timeout ([`DEFAULT_TIMEOUT`]), connect timeout
    /// ([`DEFAULT_CONNECT_TIMEOUT`]) and circuit breaker
    /// ([`CircuitBreaker::new`]).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            target: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            breaker: CircuitBreaker::new(),
            max_batch: DEFAULT_MAX_BATCH,
            deny_cache: DEFAULT_DENY_CACHE,
            leases: None,
            lease_period: DEFAULT_LEASE_PERIOD,
            lease_keys: DEFAULT_LEASE_KEYS,
            #[cfg(feature = "tls")]
            root_certificates: None,
            #[cfg(feature = "sentinel")]
            primary_auth: None,
        }
    }
}

impl RedisStoreBuilder {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` for TLS with the `tls` feature).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Url(url.into()));
        self
    }

    /// Takes one connection from the application's own deadpool-redis pool and
    /// keeps it (see [`RedisStore`]).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.target = Some(Target::Pool(pool));
        self
    }

    /// Verifies servers against these CA certificates (PEM, one or more)
    /// instead of the system's roots (cargo feature `tls`). Needs `rediss://`
    /// URLs; a server whose certificate does not verify is refused when
    /// connecting, with an error naming it.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = Some(pem.into());
        self
    }

    /// The key prefix ([`DEFAULT_PREFIX`] otherwise). It must be at most 64
    /// bytes of `[A-Za-z0-9._:/-]`, so it can neither hide a `{hash tag}` nor
    /// bloat every key.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The per-call timeout ([`DEFAULT_TIMEOUT`] otherwise): a check that takes
    /// longer fails with [`Error::Timeout`](crate::Error::Timeout). Must be
    /// between 1 ms and 60 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long one connect may take ([`DEFAULT_CONNECT_TIMEOUT`] otherwise),
    /// TLS handshake and authentication included. Connects run apart from the
    /// calls, so this may be longer than the call timeout: a slow connect still
    /// completes and serves later calls. Must be between 1 ms and 60 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most checks sent in one script call ([`DEFAULT_MAX_BATCH`]
    /// otherwise, 1 to 1024; 1 sends every check on its own). Checks are
    /// batched only while as many calls are in flight as the store allows,
    /// so this adds no latency at low load; under load it cuts Redis's cost
    /// per decision (one call, one `TIME`, one reply for the batch). The calls
    /// allowed in flight follow their round trips: as many as the least
    /// recent round trip holds at about 50 µs a call, from 2 (Redis on
    /// loopback: checks batch) up to 64 (Redis milliseconds away: a check
    /// goes out at once rather than wait for a call), and back towards 2
    /// while calls take over 4 times that least (Redis or this process
    /// saturated). The answers are the same as unbatched:
    /// the script decides a batch's checks in order. On a Redis Cluster a
    /// batch holds the checks of one primary (by the slot map the store reads
    /// with `CLUSTER SLOTS`), each primary with its own queue and its own
    /// calls in flight (from one when there are several primaries, two with
    /// one primary, as on one server); a batch the
    /// primary turns out not to serve entirely (a slot moved) writes nothing
    /// and its checks go one by one. A Redis-compatible server that refuses
    /// keys a script did not declare cannot run such batches: use 1 there.
    pub fn max_batch(mut self, checks: usize) -> Self {
        self.max_batch = checks;
        self
    }

    /// How many denials to remember in process ([`DEFAULT_DENY_CACHE`]
    /// otherwise; 0 turns the cache off). When Redis denies a client, later
    /// checks of the same cost or more on the same buckets are denied here,
    /// without a Redis call, until the wait Redis gave has passed: a flooded
    /// key costs Redis about one call per refill instead of one per request.
    /// A larger cost is told the wait for its own tokens (or asks Redis when
    /// the cached answer cannot bound it); a smaller cost, a peek and a
    /// reservation always ask Redis. A client that waits the `Retry-After`
    /// it was told is never denied by the cache. It denies only what Redis
    /// would deny (other instances only spend tokens) while Redis's clock
    /// runs at most 0.1 % faster than this host's monotonic clock (a cached
    /// wait is cut by that much); a Redis clock stepped forward by `s` can
    /// make it deny up to `s` after Redis would admit. A `reset` made on
    /// another instance or Redis losing the key is not seen until the wait
    /// has passed.
    pub fn deny_cache(mut self, denials: usize) -> Self {
        self.deny_cache = denials;
        self
    }

    /// Turns leases on or off (on by default, except on a Redis Cluster,
    /// where a node's loss of data is not detected: see the docs below):
    /// plain checks with room to spare are
    /// decided in this process, exactly, from tokens of the shared bucket
    /// that Redis holds for this instance. A key in steady use then costs
    /// Redis about one call per lease period instead of one per check; a
    /// key near its limit gets no lease and is decided in Redis check by
    /// check. The bucket's bound holds in every window, as without leases:
    /// every admission made here spends a token that is in the bucket and
    /// that no other instance can take. What leases cost is
    /// under-admission: tokens held by one instance and not spent are lost
    /// to the others until reported (or, if the report never comes, until
    /// the hold expires, after two lease periods, or 64 while the
    /// key is far from its limit). See the
    /// [Redis store docs](crate::store#leases).
    ///
    /// Holds die with the data that granted them: after `FLUSHALL`, a
    /// restart or a failover, held tokens are spent for at most a second
    /// (see the docs on the server's epoch).
    ///
    /// Only plain checks of a cost above 0 use leases; peeks, reservations,
    /// charges and `reset` always go to Redis, and a refund does, for what
    /// this instance's holds cannot take back. A decision made here reports
    /// as remaining what this instance can still spend for sure (never more
    /// than the bucket holds). Every instance sharing a prefix must run a
    /// version of tollgate that knows leases: an older one would read a
    /// bucket with holds as full.
    pub fn leases(mut self, on: bool) -> Self {
        self.leases = Some(on);
        self
    }

    /// With leases on: a lease holds about this long's worth of a key's
    /// local demand, and lives twice as long ([`DEFAULT_LEASE_PERIOD`]
    /// otherwise; 10 ms to 60 s). Longer periods cost Redis fewer calls and
    /// hold more tokens unspent.
    pub fn lease_period(mut self, period: Duration) -> Self {
        self.lease_period = period;
        self
    }

    /// With leases on: how many keys' demand and holds to keep
    /// ([`DEFAULT_LEASE_KEYS`] otherwise; at least 1). A key evicted to make
    /// room reports its holds. Each key kept takes a 128-byte slot of the
    /// map's table, and a block on the heap with its storage keys (and its
    /// name, past 36 bytes).
    pub fn lease_keys(mut self, keys: usize) -> Self {
        self.lease_keys = keys;
        self
    }

    /// The circuit breaker ([`CircuitBreaker::new`] otherwise).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// The store, or the first configuration mistake.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] when no URL or pool was given, the URL cannot be
    /// parsed (the message shows it without its password), or the prefix, a
    /// timeout or the breaker is out of range.
    pub fn build(self) -> Result<RedisStore, ConfigError> {
        let ok = self.prefix.len() <= 64
            && self
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !ok {
            return Err(ConfigError::store(format!(
                "key prefix {:?} must be at most 64 bytes of [A-Za-z0-9._:/-]",
                self.prefix
            )));
        }
        for (what, t) in [
            ("store timeout", self.timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if t < Duration::from_millis(1) || t > Duration::from_secs(60) {
                return Err(ConfigError::store(format!(
                    "{what} {t:?} must be between 1ms and 60s"
                )));
            }
        }
        self.breaker.validate()?;
        if !(1..=1024).contains(&self.max_batch) {
            return Err(ConfigError::store(format!(
                "max_batch {} must be between 1 and 1024",
                self.max_batch
            )));
        }
        if self.lease_period < Duration::from_millis(10)
            || self.lease_period > Duration::from_secs(60)
        {
            return Err(ConfigError::store(format!(
                "lease period {:?} must be between 10ms and 60s",
                self.lease_period
            )));
        }
        if self.lease_keys == 0 {
            return Err(ConfigError::store("lease_keys must be at least 1"));
        }
        let Some(target) = self.target else {
            return Err(ConfigError::store(
                "RedisStore needs a URL or a pool: call .url(..) or .pool(..) (or .cluster(..), .sentinel(..))",
            ));
        };
        // Every declared key of one call must be in one slot of a cluster,
        // and a batch mixes clients: a cluster store batches per node.
        let per_node = target.per_node();
        let settings = Settings {
            call_timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            #[cfg(feature = "tls")]
            root_certificates: self.root_certificates,
            #[cfg(feature = "sentinel")]
            primary_auth: self.primary_auth,
        };
        let (source, host) = target.source(&settings)?;
        Ok(RedisStore::assemble(Parts {
            link: Link::new(
                source,
                host,
                settings.call_timeout,
                settings.connect_timeout,
            ),
            breaker: Breaker::new(self.breaker, "redis"),
            prefix: self.prefix,
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            max_batch: self.max_batch,
            per_node,
            deny_cache: self.deny_cache,
            leases: self
                .leases
                .unwrap_or(per_node.is_none())
                .then_some(LeaseConfig {
                    period: self.lease_period,
                    max_keys: self.lease_keys,
                }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::target::redact;
    use super::*;

    #[test]
    fn passwords_never_appear_in_messages() {
        assert_eq!(
            redact("redis://:s3cret@cache.internal:6379/0"),
            "redis://:***@cache.internal:6379/0"
        );
        assert_eq!(
            redact("rediss://app:s3cret@cache.internal:6380"),
            "rediss://app:***@cache.internal:6380"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
        // Mistyped URLs hide their passwords too.
        assert_eq!(redact("user:s3cret@cache:6379"), "user:***@cache:6379");
        assert_eq!(redact("redis:/:s3cret@cache:6379"), "redis:***@cache:6379");
        assert_eq!(redact("s3cret@cache:6379"), "***@cache:6379");
        for typo in ["user:s3cret@cache:6379", "redis:/:s3cret@cache:6379"] {
            let err = RedisStore::builder().url(typo).build().unwrap_err();
            assert!(!err.to_string().contains("s3cret"), "{err}");
            assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");
        }
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?db=x&pass=s3cret"),
            "redis+unix:///tmp/r.sock?db=x&pass=***"
        );
        // A password holding '@' or '/' is still hidden.
        let url = "redis://app:p@ss/w0rd@cache:6379/1";
        assert!(!redact(url).contains("w0rd"), "{}", redact(url));
        for bad in [
            "redis://:s3cret@",
            "redis://:s3cret@host:notaport",
            "redis://u:s3cret@[::1",
            "redis://u:s3cret@host:6379/notadb",
            "redis+unix:///tmp/r.sock?db=x&pass=s3cret",
            "redis+unix:///tmp/r.sock?password=s3cret&db=nope",
        ] {
            if let Err(e) = RedisStore::from_url(bad) {
                assert!(!e.to_string().contains("s3cret"), "{e}");
            }
            let debug = format!("{:?}", RedisStore::builder().url(bad));
            assert!(!debug.contains("s3cret"), "{debug}");
        }
        let store = RedisStore::from_url("redis://u:s3cret@cache.internal:6379").unwrap();
        assert_eq!(store.host(), "cache.internal:6379");
        assert!(!format!("{store:?}").contains("s3cret"));
    }

    #[test]
    fn builder_mistakes_surface_at_build() {
        let url = || RedisStore::builder().url("redis://127.0.0.1:6379");
        assert!(url().build().is_ok());
        assert!(RedisStore::builder().build().is_err());
        assert!(url().prefix("has{brace}").build().is_err());
        assert!(url().prefix("x".repeat(65)).build().is_err());
        assert!(url().timeout(Duration::ZERO).build().is_err());
        assert!(url().timeout(Duration::from_secs(61)).build().is_err());
        assert!(url().connect_timeout(Duration::ZERO).build().is_err());
        assert!(
            url()
                .circuit_breaker(CircuitBreaker::new().failures(0))
                .build()
                .is_err()
        );
        let store = url().prefix("app:rl:").build().unwrap();
        assert_eq!(store.prefix(), "app:rl:");
        assert_eq!(store.timeout(), DEFAULT_TIMEOUT);
        assert_eq!(store.host(), "127.0.0.1:6379");
    }
}
