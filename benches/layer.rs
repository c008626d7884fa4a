//! The layer's own cost per request, without sockets: `RateLimitLayer` over a
//! tower service that answers at once, with a `MemoryStore`, keyed by a header,
//! every request admitted; against the same service without the layer.
//!
//! Run: `cargo bench --bench layer`.

use std::convert::Infallible;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::layer::RateLimitLayer;
use tollgate::{MemoryStore, Quota};
use tower::{Layer, Service, ServiceExt};

fn request(i: u64) -> Request<()> {
    Request::get("/")
        .header("x-client", format!("k{}", i % 10_000))
        .body(())
        .expect("request")
}

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let inner = tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let mut group = c.benchmark_group("layer");
    let mut plain = inner;
    let mut n = 0u64;
    group.bench_function("no layer", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(async { plain.ready().await?.call(request(n)).await })
                .expect("answer")
        })
    });
    let quota = Quota::per_second(1_000_000).expect("quota");
    let mut limited = RateLimitLayer::new(MemoryStore::new(), quota)
        .key(Header::new("x-client").unwrap().verbatim())
        .layer(inner);
    group.bench_function("memory, header key", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(async { limited.ready().await?.call(request(n)).await })
                .expect("answer")
        })
    });
    let mut hashed = RateLimitLayer::new(MemoryStore::new(), quota)
        .key(Header::new("x-client").unwrap())
        .layer(inner);
    group.bench_function("memory, hashed header key", |b| {
        b.iter(|| {
            n += 1;
            rt.block_on(async { hashed.ready().await?.call(request(n)).await })
                .expect("answer")
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = layer
}
criterion_main!(benches);
