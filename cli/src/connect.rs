//! The store the command works on, from `--url` and its companions.

use tollgate::RedisStore;

use crate::args::ConnectArgs;
use crate::fail::Failure;

/// Where the primary's password comes from with `--sentinel`: never the
/// command line, which other users of the host can read.
const PRIMARY_PASSWORD: &str = "TOLLGATE_PRIMARY_PASSWORD";

/// A store for the server the arguments name, connected and answering.
///
/// Leases, the deny cache and batching are off: every call goes to Redis
/// and this process holds no tokens when it exits.
pub(crate) async fn connect(args: &ConnectArgs) -> Result<RedisStore, Failure> {
    let store = build(args)?;
    // A PING first, so that an unreachable server is reported as such
    // (naming it, never its password) rather than as a failed check.
    store.ping().await?;
    Ok(store)
}

fn build(args: &ConnectArgs) -> Result<RedisStore, Failure> {
    let mut builder = RedisStore::builder()
        .leases(false)
        .deny_cache(0)
        .max_batch(1)
        .prefix(args.prefix.clone())
        .timeout(args.timeout)
        .connect_timeout(args.timeout);
    builder = match (&args.urls[..], args.cluster, &args.sentinel) {
        ([], _, _) => {
            return Err(Failure::usage(
                "no server: give --url redis://host:port (or set REDIS_URL)",
            ));
        }
        (urls, true, _) => builder.cluster(urls.iter().cloned()),
        (urls, false, Some(master)) => {
            let builder = builder.sentinel(urls.iter().cloned(), master.clone());
            match std::env::var(PRIMARY_PASSWORD) {
                Ok(password) => {
                    builder.sentinel_primary_auth(args.primary_user.as_deref(), &password)
                }
                Err(_) => builder,
            }
        }
        ([url], false, None) => builder.url(url.clone()),
        (_, false, None) => {
            return Err(Failure::usage(
                "several --url without --cluster or --sentinel: give one server's URL, \
                 or say what the URLs are",
            ));
        }
    };
    if let Some(path) = &args.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| Failure::usage(format!("--ca-file {}: {e}", path.display())))?;
        builder = builder.tls_root_certificates(pem);
    }
    Ok(builder.build()?)
}
