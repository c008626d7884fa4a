//! A redis-server that speaks TLS only, with a CA and a server certificate for
//! 127.0.0.1 and localhost made at run time (rcgen), and an unrelated second CA
//! for tests that must fail verification.
//!
//! The server runs `--port 0 --tls-port PORT` (no plain port at all) with
//! `--tls-auth-clients no` (clients need no certificate). The harness inspects
//! it with `redis-cli --tls --cacert CA`, so tests need no TLS in redis-rs.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::base_args;
use super::node::{self, Ports, Probe, tls_cli_args};

/// The common name of both test CAs (the wrong one differs only by its key).
const CA_NAME: &str = "tollgate test CA";

/// A store on `url` (`rediss://`) that trusts `ca` (PEM) alone, with timeouts
/// generous for a busy 2-core machine.
#[cfg(feature = "tls")]
pub fn store_trusting(url: String, ca: Vec<u8>) -> tollgate::RedisStore {
    tollgate::RedisStore::builder()
        .leases(false)
        .url(url)
        .tls_root_certificates(ca)
        .timeout(std::time::Duration::from_secs(5))
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .expect("TLS store")
}

/// A TLS-only redis-server owned by one test.
pub struct TlsRedis {
    child: Option<Child>,
    ports: Ports,
    argv: Vec<OsString>,
    probe: Probe,
    ca_pem: Vec<u8>,
    wrong_ca_pem: Vec<u8>,
    dir: tempfile::TempDir,
}

/// A CA: its parameters (to issue from) and key.
fn new_ca() -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = params.self_signed(&key).expect("CA certificate").pem();
    (params, key, pem)
}

impl TlsRedis {
    /// Makes the certificates, writes them to a temporary directory (`ca.pem`,
    /// `wrong-ca.pem`, `server.pem`, `server-key.pem`) and starts the server;
    /// returns once it answers `INFO` over TLS, verified against the CA.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let (ca_params, ca_key, ca_pem) = new_ca();
        let (_, _, wrong_ca_pem) = new_ca();
        let server_key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server certificate parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, "tollgate test redis-server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let issuer = Issuer::new(ca_params, ca_key);
        let server_pem = params
            .signed_by(&server_key, &issuer)
            .expect("server certificate")
            .pem();
        let path = |name: &str| dir.path().join(name);
        for (name, pem) in [
            ("ca.pem", &ca_pem),
            ("wrong-ca.pem", &wrong_ca_pem),
            ("server.pem", &server_pem),
            ("server-key.pem", &server_key.serialize_pem()),
        ] {
            std::fs::write(path(name), pem).expect("PEM file");
        }
        let probe = Probe::Tls { ca: path("ca.pem") };
        let (child, ports, argv) =
            node::start_process("TLS redis-server", dir.path(), false, &probe, &|p| {
                // base_args' --port is overridden: no plain TCP port at all.
                let mut argv = base_args(p.port, dir.path(), "notice");
                argv.extend([
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    p.port.to_string().into(),
                    "--tls-cert-file".into(),
                    path("server.pem").into(),
                    "--tls-key-file".into(),
                    path("server-key.pem").into(),
                    "--tls-ca-cert-file".into(),
                    path("ca.pem").into(),
                    "--tls-auth-clients".into(),
                    "no".into(),
                ]);
                argv
            });
        TlsRedis {
            child: Some(child),
            ports,
            argv,
            probe,
            ca_pem: ca_pem.into_bytes(),
            wrong_ca_pem: wrong_ca_pem.into_bytes(),
            dir,
        }
    }

    /// The TLS port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.ports.port
    }

    /// `rediss://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port())
    }

    /// `rediss://localhost:PORT` (the certificate names localhost too).
    pub fn localhost_url(&self) -> String {
        format!("rediss://localhost:{}", self.port())
    }

    /// The server's working directory, with the PEM files and its log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA that signed the server's certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.ca_pem.clone()
    }

    /// The CA's PEM file.
    pub fn ca_path(&self) -> PathBuf {
        self.dir().join("ca.pem")
    }

    /// Another CA, unrelated to the server (same name, other key), PEM: a
    /// client trusting only it must refuse the server.
    pub fn wrong_ca_pem(&self) -> Vec<u8> {
        self.wrong_ca_pem.clone()
    }

    /// The wrong CA's PEM file.
    pub fn wrong_ca_path(&self) -> PathBuf {
        self.dir().join("wrong-ca.pem")
    }

    /// The server's certificate (PEM file).
    pub fn server_cert_path(&self) -> PathBuf {
        self.dir().join("server.pem")
    }

    /// Runs `redis-cli --tls --cacert CA -h 127.0.0.1 -p PORT ARGS...` and
    /// returns its output, whatever it is.
    pub fn cli_with_ca(&self, ca: &Path, args: &[&str]) -> Output {
        Command::new(super::bins::redis_cli())
            .args(tls_cli_args(self.port(), ca))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli")
    }

    /// Runs a command through `redis-cli` over TLS (verified against the CA)
    /// and returns its raw output, or what went wrong: redis-cli's error, or
    /// the error Redis answered (`ERR ...`).
    pub fn try_cmd(&self, args: &[&str]) -> Result<String, String> {
        let out = self.cli_with_ca(&self.ca_path(), args);
        let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
        // redis-cli prints an error reply on stdout, and exits 1 for it.
        if !out.status.success() || !stderr.is_empty() {
            return Err(format!("{stdout}{stderr}"));
        }
        // Error replies come as plain lines that start with an error code.
        const CODES: [&str; 12] = [
            "ERR",
            "WRONGTYPE",
            "NOSCRIPT",
            "NOAUTH",
            "NOPERM",
            "READONLY",
            "LOADING",
            "BUSY",
            "MOVED",
            "ASK",
            "OOM",
            "EXECABORT",
        ];
        let first = stdout.split_whitespace().next().unwrap_or("");
        if CODES.contains(&first) && stdout.contains(' ') {
            return Err(stdout);
        }
        Ok(stdout)
    }

    /// [`TlsRedis::try_cmd`] that panics on any error.
    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("{args:?} over TLS: {e}"))
    }

    /// Zeroes `INFO commandstats`.
    pub fn reset_stats(&self) {
        self.cmd(&["CONFIG", "RESETSTAT"]);
    }

    /// `calls` of every command in `INFO commandstats`, by name, without the
    /// harness's own `INFO` and `CONFIG|RESETSTAT`.
    pub fn all_calls(&self) -> BTreeMap<String, u64> {
        node::parse_all_calls(&self.cmd(&["INFO", "commandstats"]))
    }

    /// `calls` of one command in `INFO commandstats` (0 when never called).
    pub fn calls(&self, command: &str) -> u64 {
        node::parse_command_stat(&self.cmd(&["INFO", "commandstats"]), command, "calls")
            .map_or(0, |v| v as u64)
    }

    /// Kills the server (SIGKILL). The port stays reserved for `restart()`.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            node::kill_child(&mut child);
        }
    }

    /// Starts the server again on the same port with the same certificates.
    pub fn restart(&mut self) {
        self.stop();
        self.child = Some(node::restart_process(
            "TLS redis-server",
            self.dir.path(),
            self.ports,
            &self.probe,
            &self.argv,
        ));
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        self.stop();
        self.ports.release();
    }
}
