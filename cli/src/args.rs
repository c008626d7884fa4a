//! The command line, as clap reads it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// What `--help` says after the options: what a key is, and the exit codes.
const KEYS_AND_EXIT_CODES: &str = "\
Keys:
  --key K names the bucket a RateLimiter of the policy checks for K:
  `RateLimiter::check(\"user:42\", 1)` under policy \"api\" is
  `--policy api --key user:42` (stored as {api:user:42}).
  The HTTP and gRPC layer keys a client as KIND:VALUE under its policy:
  `--key ip:203.0.113.7`, `--key client-ip:198.51.100.4`,
  `--key global:global`, or as `tollgate top` prints it
  (`--key header:x-api-key:#3f0c...`). To give the value as the request
  carried it, use `--kind KIND --value VALUE` (made safe as the layer makes
  it: hashed when it is long or has other bytes than [A-Za-z0-9._:@/=+#-]),
  or `--kind header:NAME --hashed-value VALUE` for a header key, which the
  layer hashes unless it is verbatim.

Exit codes:
  0  done; for `check`, admitted
  1  `check` refused: the wait is printed
  2  a mistake in the command, the URL, the limits file or a quota
  3  the store failed: unreachable, timed out, or an error from Redis";

/// Look at and change rate limit buckets in Redis, as tollgate stores them.
///
/// The limits come from the application's limits file (`--config`, the
/// `[[policy]]` entries a `PolicyTable` reads) or from `--policy` and
/// `--quota`; the server from `--url` (or `REDIS_URL`).
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, after_long_help = KEYS_AND_EXIT_CODES)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) connect: ConnectArgs,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
    /// Print one JSON object instead of text (errors too, with the exit code
    /// unchanged).
    #[arg(long, global = true, help_heading = "Output")]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the buckets are.
#[derive(Debug, Args)]
#[command(next_help_heading = "Server")]
pub(crate) struct ConnectArgs {
    /// The Redis URL (redis://[user:password@]host:port/db, rediss:// for
    /// TLS). Repeat it for the seeds of a cluster or for sentinels.
    #[arg(
        short,
        long = "url",
        value_name = "URL",
        env = "REDIS_URL",
        hide_env_values = true,
        global = true
    )]
    pub(crate) urls: Vec<String>,
    /// The URLs are seeds of a Redis Cluster.
    #[arg(long, global = true, conflicts_with = "sentinel")]
    pub(crate) cluster: bool,
    /// The URLs are Sentinels: use the primary they know by this name. Its
    /// password, if any, is read from TOLLGATE_PRIMARY_PASSWORD.
    #[arg(long, value_name = "MASTER", global = true)]
    pub(crate) sentinel: Option<String>,
    /// With --sentinel: the primary's user name.
    #[arg(long, value_name = "USER", global = true, requires = "sentinel")]
    pub(crate) primary_user: Option<String>,
    /// Trust these CA certificates (PEM) for rediss:// URLs instead of the
    /// system's.
    #[arg(long, value_name = "PEM_FILE", global = true)]
    pub(crate) ca_file: Option<PathBuf>,
    /// The key prefix the application's store uses.
    #[arg(long, default_value = tollgate::store::DEFAULT_PREFIX, global = true)]
    pub(crate) prefix: String,
    /// The longest one connect or one call may take (`500ms`, `2s`).
    #[arg(long, default_value = "2s", value_parser = crate::show::parse_duration, global = true)]
    pub(crate) timeout: std::time::Duration,
}

/// Which limits.
#[derive(Debug, Args)]
#[command(next_help_heading = "Limits")]
pub(crate) struct LimitArgs {
    /// The limits file: `[[policy]]` entries with `name` and `quotas`, as the
    /// application's `PolicyTable` reads them.
    #[arg(
        short,
        long,
        value_name = "FILE",
        global = true,
        conflicts_with = "quotas"
    )]
    pub(crate) config: Option<PathBuf>,
    /// The policy: an entry of the file (needed when it has several), or
    /// the name of the quotas given with --quota (`default` without it, as
    /// for a RateLimiter built from a bare Quota).
    #[arg(short, long, value_name = "NAME", global = true)]
    pub(crate) policy: Option<String>,
    /// A quota of the policy in its text form (`10/s burst 20`, `1000/h`).
    /// Repeat it for a policy of several.
    #[arg(short, long = "quota", value_name = "QUOTA", global = true)]
    pub(crate) quotas: Vec<String>,
}

/// Which bucket: one of `--key`, or `--kind` with `--value` or
/// `--hashed-value` (see "Keys" in `--help`).
#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The key, as a RateLimiter of the policy takes it (the layer's:
    /// KIND:VALUE).
    #[arg(short, long, required_unless_present = "kind", conflicts_with = "kind")]
    pub(crate) key: Option<String>,
    /// The kind of a layer's key (`ip`, `client-ip`, `header:x-api-key`,
    /// `route`, `custom:NAME`), with --value or --hashed-value.
    #[arg(long)]
    pub(crate) kind: Option<String>,
    /// The key's value as the request carried it, made safe as the layer
    /// makes it.
    #[arg(long, requires = "kind", conflicts_with = "hashed_value")]
    pub(crate) value: Option<String>,
    /// The key's value as the request carried it, hashed as a header key
    /// is unless verbatim.
    #[arg(long, requires = "kind")]
    pub(crate) hashed_value: Option<String>,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Every quota's remaining tokens, reset time and holds for one key.
    /// Spends nothing.
    #[command(after_long_help = KEYS_AND_EXIT_CODES)]
    Peek(KeyArgs),
    /// Forget one key's buckets: its next check finds them full.
    #[command(after_long_help = KEYS_AND_EXIT_CODES)]
    Reset(KeyArgs),
    /// Spend tokens from one key's buckets, as a check in the application
    /// would: exit 0 when admitted, 1 when refused (printing the wait). For
    /// shell jobs and crons that share a limit across hosts.
    #[command(after_long_help = KEYS_AND_EXIT_CODES)]
    Check {
        #[command(flatten)]
        key: KeyArgs,
        /// The tokens to spend.
        #[arg(long, default_value_t = 1)]
        cost: u64,
    },
    /// The buckets of a policy nearest their limit. Finds them with SCAN,
    /// bounded by --scan: on a large keyspace it says how far it got.
    #[command(after_long_help = KEYS_AND_EXIT_CODES)]
    Top {
        /// How many buckets to show.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Visit at most about this many keys of the keyspace (the sum of
        /// the SCAN calls' COUNT), shared between a cluster's primaries.
        #[arg(long, default_value_t = 10_000)]
        scan: u64,
    },
}
