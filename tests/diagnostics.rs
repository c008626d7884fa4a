//! The compiler's errors for the common mistakes name the fix: a crate
//! that makes them is checked (`cargo check`, offline, against this
//! checkout) and its errors must carry the help lines of
//! `#[diagnostic::on_unimplemented]` on `KeyExtractor`.
//!
//! - `ClientIp::trusted_proxies([..])` without `?` is a `Result`, not a key
//!   extractor: the help says to add `?`.
//! - `ClientIp::hops(1)?` without `.only_from([..])` is a builder: the help
//!   says to finish it.

use std::path::Path;
use std::process::Command;

const MISTAKES: &str = r#"
use tollgate::{MemoryStore, Quota, key::ClientIp, layer::RateLimitLayer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _forgot_the_question_mark = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(1)?)
        .key(ClientIp::trusted_proxies(["10.0.0.0/8"]));
    let _unfinished_builder = RateLimitLayer::new(MemoryStore::new(), Quota::per_second(1)?)
        .key(ClientIp::hops(1)?);
    Ok(())
}
"#;

/// The errors of checking `main` in a crate that depends on this checkout
/// (no default features: the key extractors need none).
fn check(main: &str) -> String {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("diagnostics");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = format!(
        "[package]\nname = \"mistakes\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
         [dependencies]\ntollgate = {{ path = {:?}, default-features = false }}\n[workspace]\n",
        here.display().to_string()
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/main.rs"), main).unwrap();
    // The same versions as this checkout's, so nothing is fetched.
    std::fs::copy(here.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["check", "--offline", "--quiet", "--color", "never"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(!out.status.success(), "the mistakes compiled");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The part of `errors` about the error whose headline contains `headline`.
fn error<'a>(errors: &'a str, headline: &str) -> &'a str {
    let start = errors
        .find(headline)
        .unwrap_or_else(|| panic!("no error {headline:?} in:\n{errors}"));
    let rest = &errors[start..];
    let end = rest[1..].find("\nerror").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

#[test]
fn key_extractor_mistakes_say_how_to_fix_them() {
    let errors = check(MISTAKES);
    let result = error(
        &errors,
        "`Result<ClientIp, ConfigError>` is not a key extractor",
    );
    assert!(result.contains("add `?` after it"), "{result}");
    let builder = error(&errors, "`ClientIpBuilder` is not a key extractor");
    assert!(
        builder.contains("finish it with `.only_from(["),
        "{builder}"
    );
}
