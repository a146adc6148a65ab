//! What the service's tests share: a real `opledger_http::serve` on a
//! fresh database of a backend, listening on a free loopback port, with a
//! token of each role, and a client that speaks to it.
//!
//! Each test binary includes this module and uses a part of it.

use opledger_engine::Engine;
use opledger_http::{App, Role, ServiceConfig, TokenEntry, Tokens};
use opledger_testkit::Backend;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::net::SocketAddr;
use std::time::Duration;

/// Who a request is made as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum As {
    Anonymous,
    Reader,
    Worker,
    /// A worker token limited to the `thumbnail` kind.
    ThumbnailWorker,
    Admin,
}

pub const EVERYONE: [As; 5] = [As::Anonymous, As::Reader, As::Worker, As::ThumbnailWorker, As::Admin];

/// A running service and its tokens.
pub struct Service<S: opledger_store::Store> {
    pub address: SocketAddr,
    pub app: App<S>,
    pub http: reqwest::Client,
    tokens: Vec<(As, String)>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<Result<(), opledger_http::ServeError>>>,
}

/// The tokens every test service accepts.
fn test_tokens() -> (Tokens, Vec<(As, String)>) {
    let made = [
        (As::Reader, "reader", Role::Reader, vec![]),
        (As::Worker, "worker", Role::Worker, vec![]),
        (
            As::ThumbnailWorker,
            "thumbnailer",
            Role::Worker,
            vec!["thumbnail".to_string()],
        ),
        (As::Admin, "admin", Role::Admin, vec![]),
    ];
    let mut entries: Vec<TokenEntry> = Vec::new();
    let mut tokens = Vec::new();
    for (who, name, role, kinds) in made {
        let (token, entry) = opledger_http::new_token(name, role, kinds).unwrap();
        entries.push(entry);
        tokens.push((who, token));
    }
    let text: String = entries
        .iter()
        .map(opledger_http::entry_toml)
        .collect::<Vec<_>>()
        .join("\n");
    (Tokens::parse(&text).unwrap(), tokens)
}

/// Starts a service on `backend`'s database and waits until it is ready.
pub async fn start<B: Backend>(backend: &B) -> Service<B::Store> {
    start_with(backend, |_| {}).await
}

/// Starts a service whose configuration `adjust` changed.
pub async fn start_with<B: Backend>(backend: &B, adjust: impl FnOnce(&mut ServiceConfig)) -> Service<B::Store> {
    let store = backend.open().await;
    let (tokens, held) = test_tokens();
    let mut config = ServiceConfig {
        tokens,
        recovery_interval: Duration::from_millis(500),
        ..ServiceConfig::default()
    };
    adjust(&mut config);
    let app = App::new(Engine::new(store), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(opledger_http::serve(app.clone(), listener, async move {
        let _ = stopped.await;
    }));
    let service = Service {
        address,
        app,
        http: reqwest::Client::new(),
        tokens: held,
        stop: Some(stop),
        served: Some(served),
    };
    for _ in 0..500 {
        if service.app.is_ready() {
            return service;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the service did not become ready in 5 s");
}

/// An answer: status and JSON body (`Value::Null` when not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub bytes: Vec<u8>,
}

impl<S: opledger_store::Store> Service<S> {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    pub fn token(&self, who: As) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(held, _)| *held == who)
            .map(|(_, token)| token.as_str())
    }

    /// A request as `who`, with a JSON body when given.
    pub async fn call(&self, method: Method, path: &str, who: As, body: Option<Value>) -> Answer {
        self.call_with(method, path, who, body, &[]).await
    }

    /// A POST as `who` with an `Idempotency-Key` header.
    pub async fn post_keyed(&self, path: &str, who: As, body: Value, key: &str) -> Answer {
        self.call_with(Method::POST, path, who, Some(body), &[("Idempotency-Key", key)])
            .await
    }

    /// [`Service::call`] with extra headers.
    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        who: As,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self.http.request(method, self.url(path));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(token) = self.token(who) {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the service answers");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("the body reads").to_vec();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            headers,
            body,
            bytes,
        }
    }

    pub async fn get(&self, path: &str, who: As) -> Answer {
        self.call(Method::GET, path, who, None).await
    }

    pub async fn post(&self, path: &str, who: As, body: Value) -> Answer {
        self.call(Method::POST, path, who, Some(body)).await
    }

    /// Stops the service as SIGTERM would and waits for it to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(served) = self.served.take() {
            tokio::time::timeout(Duration::from_secs(30), served)
                .await
                .expect("the service stops within 30 s")
                .unwrap()
                .unwrap();
        }
    }
}

impl<S: opledger_store::Store> Drop for Service<S> {
    fn drop(&mut self) {
        if let Some(served) = self.served.take() {
            served.abort();
        }
    }
}

/// Asserts an error answer's status and code, in the one error shape.
pub fn assert_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status.as_u16(), status, "{answer:?}");
    assert_eq!(answer.body["error"]["code"], code, "{answer:?}");
    assert!(answer.body["error"]["message"].is_string(), "{answer:?}");
}
