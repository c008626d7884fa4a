//! The watch: a subscription that a standalone or Sentinel store keeps on its
//! server once a reply said holds were granted there, so that a loss of data
//! is known even when nobody who heard of the holds calls first.
//!
//! The channel is named as the epoch key (`{prefix}epoch`; channels and keys
//! are apart). A call that finds the epoch key gone publishes on it: the
//! answer counts the watchers, so a newcomer (a store that never heard of
//! the server's epoch, and cannot tell a wiped server from a new one) learns
//! that holds may exist and the script stands in for them (see "Epochs" in
//! `lua/token_bucket.lua`); the message stops every watcher's holds at once.
//! The watch's connection breaking (a restart, a failover behind the same
//! address) stops them too, before any call meets a broken connection.
//! Holds are spent only while the watch is up (see [`ServerEpoch`]).
//!
//! A store built on the application's pool has no way to open a
//! subscription and keeps no watch, and one whose ACL forbids the channel
//! gives it up: their holds do without (`src/docs/redis.md` says what that
//! leaves).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_core::Stream;
use redis::RedisError;
use redis::aio::PubSubStream;

use super::connection::{Inner, Link, Source};
use super::epoch::ServerEpoch;

/// Waits between attempts to subscribe: from the first, doubling up to the
/// second (a server that is down costs a connect attempt a second).
const FIRST_RETRY: Duration = Duration::from_millis(50);
const LAST_RETRY: Duration = Duration::from_secs(1);

/// How often a watch that hears nothing looks whether its store is gone.
const LIVENESS: Duration = Duration::from_secs(1);

/// Starts the watch of `link`'s store, the first time it is wanted (a reply
/// said holds were granted on the server): called before every call.
pub(crate) fn start(link: &Link) {
    if let Some((inner, epoch)) = link.claim_watch() {
        tokio::spawn(run(inner, epoch));
    }
}

/// Whether a store on `source` can keep a watch.
pub(crate) fn can_watch(source: &Source) -> bool {
    match source {
        Source::Client(_) => true,
        #[cfg(feature = "sentinel")]
        Source::Sentinel(_) => true,
        _ => false,
    }
}

/// A subscription to `channel` on the server `source` leads to now.
async fn subscribe(source: &Source, channel: &str) -> Result<PubSubStream, RedisError> {
    let client = match source {
        Source::Client(client) => client.clone(),
        #[cfg(feature = "sentinel")]
        Source::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        _ => return Err(RedisError::from(std::io::Error::other("no watch here"))),
    };
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub.into_on_message())
}

/// Marks the watch down when dropped: when its task ends, including when
/// the runtime it ran on shuts down.
struct Down(Arc<ServerEpoch>);

impl Drop for Down {
    fn drop(&mut self) {
        self.0.set_watching(false);
        self.0.disconnected();
    }
}

/// Keeps the watch of the store whose link is `inner` up until the store is
/// dropped: subscribes (again after a failure, backing off), and stops the
/// holds whenever a message comes or the subscription ends.
async fn run(inner: Weak<Inner>, epoch: Arc<ServerEpoch>) {
    let channel = epoch.key().to_owned();
    let mut retry = FIRST_RETRY;
    loop {
        let subscribed = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            tokio::time::timeout(inner.connect_timeout, subscribe(&inner.source, &channel)).await
        };
        match subscribed {
            Ok(Ok(mut messages)) => {
                retry = FIRST_RETRY;
                // A loss before the subscription was up told nobody: holds
                // wait for a reply to a call sent from now on.
                epoch.disconnected();
                epoch.set_watching(true);
                let _down = Down(Arc::clone(&epoch));
                loop {
                    let next =
                        std::future::poll_fn(|cx| std::pin::Pin::new(&mut messages).poll_next(cx));
                    match tokio::time::timeout(LIVENESS, next).await {
                        // A loss was published: holds stop until a reply
                        // tells the new epoch.
                        Ok(Some(_)) => epoch.disconnected(),
                        // The connection broke.
                        Ok(None) => break,
                        Err(_) if inner.strong_count() == 0 => return,
                        Err(_) => {}
                    }
                }
            }
            Ok(Err(e)) if e.code() == Some("NOPERM") => {
                // The ACL forbids the channel: this store does without a
                // watch, as one built on a pool does.
                #[cfg(feature = "tracing")]
                tracing::warn!(
                    error = %e,
                    channel = %channel,
                    "tollgate: the store's watch is not allowed to subscribe; \
                     holds are spent without it (see the leases docs)"
                );
                let _ = e;
                epoch.forgo_watch();
                return;
            }
            Ok(Err(e)) => {
                #[cfg(feature = "tracing")]
                tracing::debug!(error = %e, "tollgate: the store's watch could not subscribe");
                let _ = e;
            }
            Err(_) => {}
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(LAST_RETRY);
    }
}
