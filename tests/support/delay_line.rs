//! One direction of a TCP proxy that holds every chunk a while before it
//! passes it on, as a network that far would: a delay line, so chunks keep
//! their order and one chunk's wait does not add to the next one's. Plain
//! std threads, no runtime: the harness's `Proxy` and `peer-server
//! delay-proxy` (benches/http_peers, which includes this file) both run on
//! it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// What becomes of a chunk just read.
pub enum Pass {
    /// Held, then passed on.
    On,
    /// Dropped; the line goes on.
    Drop,
    /// Dropped, and both sockets of the reading side shut: the line ends.
    Cut,
}

/// Carries what `from` sends on to `to`: a reader thread stamps each chunk
/// with when it may go on (`delay()` after it was read) and a writer
/// thread, alone on `to`, writes the chunks in order, each at its time.
/// `inspect` sees (and may change) each chunk first. When `from` closes,
/// the writer passes on what it holds, then shuts `to` down.
pub fn spawn(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: impl Fn() -> Duration + Send + 'static,
    mut inspect: impl FnMut(&mut [u8]) -> Pass + Send + 'static,
) {
    let (line, out) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &mut buf[..n];
            match inspect(chunk) {
                Pass::On => {}
                Pass::Drop => continue,
                Pass::Cut => {
                    let _ = from.shutdown(Shutdown::Both);
                    break;
                }
            }
            if line
                .send((Instant::now() + delay(), chunk.to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (due, chunk) in out {
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                thread::sleep(wait);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
}
