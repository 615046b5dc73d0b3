//! The stand-in on a real socket: plain HTTP/1.1 on a TCP listener, for a measurement that
//! needs the client in another process (the operator's own peak RSS, apart from the
//! stand-in's object history). Every connection is served as one identity, as if the
//! client authenticated as it; the requests are the in-process service's, unchanged.

use std::convert::Infallible;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::service::{ApiService, ResponseBody};
use super::{Cluster, Identity};

impl Cluster {
    /// Serves the API on `listener` as `identity` until the task is aborted; a client
    /// reaches it with `kube::Config::new("http://ADDRESS".parse()?)`.
    pub fn serve(&self, listener: TcpListener, identity: Identity) -> tokio::task::JoinHandle<()> {
        let service = self.service(identity);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = service.clone();
                tokio::spawn(async move {
                    let answer = service_fn(move |request| answer(service.clone(), request));
                    // A client that goes away mid-request ends its connection only.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
            }
        })
    }
}

async fn answer(
    service: ApiService,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return Ok(Response::builder()
                .status(400)
                .body(ResponseBody::new(
                    http_body_util::Full::new(bytes::Bytes::from(e.to_string()))
                        .map_err(|never| match never {}),
                ))
                .expect("a static response"));
        }
    };
    Ok(service
        .handle(Request::from_parts(parts, ::kube::client::Body::from(body)))
        .await)
}
