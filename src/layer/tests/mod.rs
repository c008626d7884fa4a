//! Tests of the whole layer, grouped by feature (one file each); the helpers
//! they share are here.

mod answers;
mod delay;
mod fast_path;
mod held;
mod keys;
mod shadow;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};

use crate::layer::ResponseBody;

fn text(body: impl Into<Bytes>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(body.into())))
}

async fn body_text(res: Response<ResponseBody<Full<Bytes>>>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// An extractor whose future waits once before answering, counting how
/// often it is asked.
struct Waiting(Arc<AtomicUsize>);

impl crate::key::KeyExtractor for Waiting {
    fn kind(&self) -> crate::key::Kind {
        crate::key::Kind::custom("waiting")
    }

    async fn extract(&self, _: &http::request::Parts) -> Option<String> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        Some("client".to_owned())
    }
}
