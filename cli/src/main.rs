//! `tollgate`: look at and change rate limit buckets in Redis, as the
//! tollgate crate stores them. See `tollgate --help` and `cli/README.md`.

mod args;
mod check;
mod connect;
mod fail;
mod key;
mod limits;
mod outcome;
mod peek;
mod reset;
mod show;
mod top;

use std::process::ExitCode;

use clap::Parser;
use serde_json::json;
use tollgate::{Policy, RedisStore};

use args::{Cli, Command, KeyArgs};
use fail::Failure;
use outcome::Outcome;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match run(cli).await {
        Ok(outcome) => {
            if json {
                println!("{}", outcome.json);
            } else {
                print!("{}", outcome.text);
            }
            outcome.code
        }
        Err(failure) => {
            if json {
                let error =
                    json!({"error": {"kind": failure.kind_name(), "message": failure.message()}});
                println!("{error}");
            }
            eprintln!("tollgate: {failure}");
            failure.exit_code()
        }
    }
}

async fn run(cli: Cli) -> Result<Outcome, Failure> {
    match &cli.command {
        Command::Peek(key) => {
            let (store, policy, key) = prepare(&cli, key).await?;
            peek::peek(&store, &policy, &key).await
        }
        Command::Reset(key) => {
            let (store, policy, key) = prepare(&cli, key).await?;
            reset::reset(&store, &policy, &key).await
        }
        Command::Check { key, cost } => {
            let (store, policy, key) = prepare(&cli, key).await?;
            check::check(&store, &policy, &key, *cost).await
        }
        Command::Top { limit, scan } => {
            let policy = limits::policy(&cli.limits)?;
            let store = connect::connect(&cli.connect).await?;
            let ask = top::Top {
                policy: &policy,
                limit: *limit,
                scan: *scan,
            };
            top::top(&store, &ask).await
        }
    }
}

/// The store, the policy and the key of a command on one key. The limits
/// and the key are read before connecting, so that a mistake in them is
/// told without waiting for a server.
async fn prepare(cli: &Cli, key: &KeyArgs) -> Result<(RedisStore, Policy, String), Failure> {
    let policy = limits::policy(&cli.limits)?;
    let key = key::limiter_key(key)?;
    let store = connect::connect(&cli.connect).await?;
    Ok((store, policy, key))
}
