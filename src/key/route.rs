//! [`Route`]: the route template an axum `Router` matched, such as `/items/{id}`.

use http::request::Parts;

use super::extractor::{KeyExtractor, Kind};
use crate::store::safe_key;

/// The route template the request matched in an axum `Router` (axum's
/// `MatchedPath`): `/items/{id}` for `/items/1` and `/items/2` alike, so a route
/// is one bucket (or, combined, one bucket per client and route).
///
/// Keying by the request path instead (`parts.uri.path()`) would make one bucket
/// per id: unbounded keys, and a client could step around a per-route limit by
/// varying the id. The template comes from your router, never from the client.
///
/// - Needs tollgate's `axum` feature. axum inserts `MatchedPath` when it routes
///   the request, before the layers of `Router::route_layer` and
///   `Router::layer` run; nested routers give the whole template.
/// - A request no route matched (axum's fallback, a 404) has no template and so
///   no key, and the layer's missing-key policy applies: with
///   `Router::layer`, unknown paths are answered 400 by the default
///   [`MissingKey::reject`](crate::layer::MissingKey::reject). Use
///   `Router::route_layer`, which only sees matched routes, or
///   [`MissingKey::fallback`](crate::layer::MissingKey::fallback).
/// - Templates made only of safe characters (`/login`) stay readable in the
///   store; others (`/items/{id}`: braces) are hashed, like any key part that
///   could move a Redis `{hash tag}`.
///
/// The kind is `route`. A bucket per client and route:
///
/// ```
/// use std::net::SocketAddr;
/// use axum::{Router, routing::get};
/// use http::Request;
/// use tollgate::key::{KeyExtractorExt, PeerIp, Route};
/// use tollgate::{MemoryStore, Quota, RateLimitLayer};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limit = RateLimitLayer::new(MemoryStore::new(), Quota::per_minute(2)?)
///     .key(Route.and(PeerIp::new()));
/// let app = Router::new()
///     .route("/items/{id}", get(|| async { "item" }))
///     .route_layer(limit);
/// let get = |path: &str| {
///     Request::get(path)
///         .extension(SocketAddr::from(([203, 0, 113, 7], 40_000)))
///         .body(axum::body::Body::empty())
/// };
/// // Three different ids, one route: the third is over the limit.
/// for (path, status) in [("/items/1", 200), ("/items/2", 200), ("/items/3", 429)] {
///     assert_eq!(app.clone().oneshot(get(path)?).await?.status(), status);
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
#[must_use]
pub struct Route;

impl KeyExtractor for Route {
    fn kind(&self) -> Kind {
        Kind::reserved("route")
    }

    async fn extract(&self, parts: &Parts) -> Option<String> {
        let template = parts.extensions.get::<axum::extract::MatchedPath>()?;
        Some(safe_key(template.as_str()).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::routing::get;
    use tower::ServiceExt;

    /// The key `Route` finds for `path` in a router of a few templates.
    async fn key_of(path: &str) -> String {
        async fn answer(req: Request) -> String {
            let (parts, _) = req.into_parts();
            Route.extract(&parts).await.unwrap_or_else(|| "-".into())
        }
        let nested = Router::new().route("/{id}", get(answer));
        let app = Router::new()
            .route("/login", get(answer))
            .route("/items/{id}", get(answer))
            .route("/files/{*rest}", get(answer))
            .nest("/v1/users", nested)
            .fallback(answer);
        let req = axum::http::Request::get(path).body(Body::empty()).unwrap();
        let res = app.oneshot(req).await.unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn one_key_per_template() {
        assert_eq!(Route.kind(), "route");
        assert_eq!(key_of("/login").await, "/login");
        let item = key_of("/items/1").await;
        assert_eq!(item, safe_key("/items/{id}"));
        assert_eq!(key_of("/items/9999999").await, item);
        let file = key_of("/files/a/b/c").await;
        assert_eq!(file, key_of("/files/x").await);
        assert_ne!(file, item);
        assert_eq!(key_of("/v1/users/7").await, safe_key("/v1/users/{id}"));
        // No route matched: no key.
        assert_eq!(key_of("/nowhere").await, "-");
    }

    /// The bytes a URI path may hold.
    const PATH_BYTES: &[u8] = b"////abcitemsfilesv1users019-_~%.";

    proptest::proptest! {
        #![proptest_config(crate::hostile_input::config())]

        #[test]
        fn any_path_gives_a_template_key_or_none_within_budget(
            path in crate::hostile_input::motif(PATH_BYTES, 60 * 1024),
        ) {
            let path = format!("/{}", String::from_utf8(path).unwrap());
            if http::Uri::try_from(path.as_str()).is_err() {
                return Ok(());
            }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let key = crate::hostile_input::within_budget("route", || rt.block_on(key_of(&path)));
            let templates = ["/login", "/items/{id}", "/files/{*rest}", "/v1/users/{id}"];
            let known = templates.iter().any(|t| safe_key(t) == key.as_str());
            proptest::prop_assert!(known || key == "-", "{}", key);
        }
    }
}
