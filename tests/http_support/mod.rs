//! Shared by the HTTP tests: a real axum server on loopback and a real hyper client that can
//! connect from a chosen loopback address (127.0.0.0/8 all reach the server on Linux).

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Serves `app` on an ephemeral loopback port with connect info; returns its address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Serves `app` as `axum::serve(listener, app)` does without connect info: the layer sees no
/// peer address.
pub async fn serve_without_connect_info(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive client whose connections come from `local`.
pub fn client_from(local: &str) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_local_address(Some(local.parse::<IpAddr>().unwrap()));
    Client::builder(TokioExecutor::new()).build(conn)
}

/// One response, body read in full.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    pub fn num(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .parse()
            .unwrap()
    }
}

/// Sends `method path` with `headers`.
pub async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

pub async fn get(
    client: &HttpClient,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    send(client, addr, "GET", path, headers).await
}
