//! What handlers take from a request, with every refusal in the service's
//! error shape: the caller (from the bearer token), a JSON body, query
//! parameters, ids in the path.

use crate::app::App;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use opledger_domain::quoted;
use opledger_engine::{CommandContext, RequestId};
use opledger_store::Store;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Who is asking: a token's name, role and task kinds, or anonymous.
#[derive(Debug, Clone)]
pub struct Caller {
    /// `None` for an anonymous request.
    pub role: Option<Role>,
    /// The token's name (`anonymous` without one): recorded as the actor
    /// of what an admin or worker does, unless the request names a worker.
    pub name: String,
    /// The task kinds a worker token is limited to; empty for any.
    pub kinds: Vec<String>,
    /// The token entry's access-policy revision
    /// ([`crate::TokenEntry::policy_revision`]); empty for anonymous.
    pub policy: String,
    allow_anonymous_read: bool,
}

impl Caller {
    /// Refuses a caller whose role is below `role`: 401 without a token
    /// (unless anonymous reading is allowed and `role` is reader), 403
    /// with one.
    pub fn require(&self, role: Role) -> ApiResult<()> {
        match self.role {
            None if role == Role::Reader && self.allow_anonymous_read => Ok(()),
            None => Err(ApiError::unauthenticated(format!(
                "this needs a bearer token with role {role} (Authorization: Bearer TOKEN)"
            ))),
            Some(held) if held >= role => Ok(()),
            Some(held) => Err(ApiError::forbidden(format!(
                "token {} has role {held}; this needs {role}",
                quoted(&self.name)
            ))),
        }
    }

    /// The principal a job token is bound to and its policy revision: a
    /// named token at or above `role`. Anonymous callers are refused (401)
    /// even where anonymous reading is allowed: a job token needs someone
    /// to belong to.
    pub fn principal(&self, role: Role) -> ApiResult<(&str, &str)> {
        if self.role.is_none() {
            return Err(ApiError::unauthenticated(format!(
                "exports belong to the token that made them: this needs a bearer token with role {role} \
                 (Authorization: Bearer TOKEN)"
            )));
        }
        self.require(role)?;
        Ok((self.name.as_str(), self.policy.as_str()))
    }

    /// Refuses a worker token limited to other task kinds (403).
    pub fn may_work_on(&self, kind: &str) -> ApiResult<()> {
        if self.role == Some(Role::Admin) || self.kinds.is_empty() || self.kinds.iter().any(|own| own == kind) {
            return Ok(());
        }
        Err(ApiError::forbidden(format!(
            "token {} may not work on task kind {} (it may: {})",
            quoted(&self.name),
            quoted(kind),
            self.kinds.join(", ")
        )))
    }

    /// The task kinds a claim of `asked` kinds may take: `asked` when the
    /// token allows them all, the token's own kinds when none are asked.
    pub fn claimable_kinds(&self, asked: &[String]) -> ApiResult<Vec<String>> {
        if asked.is_empty() && self.role != Some(Role::Admin) {
            return Ok(self.kinds.clone());
        }
        for kind in asked {
            self.may_work_on(kind)?;
        }
        Ok(asked.to_vec())
    }
}

impl<S: Store> FromRequestParts<App<S>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App<S>) -> Result<Self, Self::Rejection> {
        let allow_anonymous_read = app.config().allow_anonymous_read;
        let Some(value) = parts.headers.get(header::AUTHORIZATION) else {
            return Ok(Caller {
                role: None,
                name: "anonymous".to_string(),
                kinds: Vec::new(),
                policy: String::new(),
                allow_anonymous_read,
            });
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|text| text.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthenticated("the Authorization header is not `Bearer TOKEN`"))?;
        let entry = app
            .config()
            .tokens
            .find(token)
            .ok_or_else(|| ApiError::unauthenticated("the bearer token is not one this service accepts"))?;
        Ok(Caller {
            role: Some(entry.role),
            name: entry.name.clone(),
            kinds: entry.kinds.clone(),
            policy: entry.policy_revision(),
            allow_anonymous_read,
        })
    }
}

/// A JSON request body: 413 over the limit (before any parsing), 400 when
/// it is not JSON of the expected shape (nesting deeper than serde_json's
/// limit of 128 included), 422 when any text in it (a key or a string, at
/// any depth) holds a NUL character or is longer than the text limit
/// (`max_text_bytes`): every text a client sends may be recorded and shown.
pub struct JsonBody<T>(pub T);

impl<S: Store, T: DeserializeOwned> FromRequest<App<S>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &App<S>) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(request, app).await?;
        let value: Value = parse_json(&bytes)?;
        check_texts(&value, Some(app.config().max_text_bytes), &mut Vec::new())?;
        parse_value(value).map(JsonBody)
    }
}

/// A JSON body carrying a document (a declaration file): as [`JsonBody`],
/// but its texts are bounded by the body limit alone.
pub struct DocumentBody<T>(pub T);

impl<S: Store, T: DeserializeOwned> FromRequest<App<S>> for DocumentBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &App<S>) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(request, app).await?;
        let value: Value = parse_json(&bytes)?;
        check_texts(&value, None, &mut Vec::new())?;
        parse_value(value).map(DocumentBody)
    }
}

/// Refuses a NUL character in any key or string of `value`, and a string
/// longer than `limit` bytes, naming where it is (`at`: the keys and
/// indexes above it).
fn check_texts(value: &Value, limit: Option<usize>, at: &mut Vec<String>) -> ApiResult<()> {
    let text = |text: &str, at: &[String]| -> ApiResult<()> {
        let place = || {
            if at.is_empty() {
                "the body".to_string()
            } else {
                quoted(&at.join(".")).to_string()
            }
        };
        if text.contains('\0') {
            return Err(ApiError::invalid(format!("{} holds a NUL character", place())));
        }
        match limit {
            Some(limit) if text.len() > limit => Err(ApiError::invalid(format!(
                "{} is {} bytes, more than the {limit} a text may take (the service's --max-text-bytes)",
                place(),
                text.len()
            ))),
            _ => Ok(()),
        }
    };
    match value {
        Value::String(string) => text(string, at),
        Value::Array(items) => items.iter().enumerate().try_for_each(|(index, item)| {
            at.push(index.to_string());
            let checked = check_texts(item, limit, at);
            at.pop();
            checked
        }),
        Value::Object(fields) => fields.iter().try_for_each(|(key, field)| {
            at.push(key.clone());
            let checked = text(key, at).and_then(|()| check_texts(field, limit, at));
            at.pop();
            checked
        }),
        _ => Ok(()),
    }
}

fn parse_value<T: DeserializeOwned>(value: Value) -> ApiResult<T> {
    serde_json::from_value(value).map_err(|error| {
        ApiError::malformed(format!(
            "the body is not the JSON expected: {}",
            quoted(&error.to_string())
        ))
    })
}

/// A JSON body that may be absent (an empty body reads as `T::default()`).
pub struct OptionalBody<T>(pub T);

impl<S: Store, T: DeserializeOwned + Default> FromRequest<App<S>> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, app: &App<S>) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(request, app).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        let value: Value = parse_json(&bytes)?;
        check_texts(&value, Some(app.config().max_text_bytes), &mut Vec::new())?;
        parse_value(value).map(OptionalBody)
    }
}

/// The raw body, bounded by the service's limit and its body timeout (408).
pub async fn body_bytes<S: Store>(request: Request, app: &App<S>) -> ApiResult<Bytes> {
    let within = app.config().body_timeout;
    tokio::time::timeout(within, Bytes::from_request(request, app))
        .await
        .map_err(|_| {
            ApiError::timeout(format!(
                "the request body did not arrive within {} s",
                within.as_secs_f64()
            ))
        })?
        .map_err(|rejection| match rejection {
            BytesRejection::FailedToBufferBody(failed) if failed.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::too_large(format!(
                    "the request body is over the limit of {} bytes",
                    app.config().body_limit
                ))
            }
            other => ApiError::malformed(format!("cannot read the request body: {}", quoted(&other.body_text()))),
        })
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(bytes).map_err(|error| {
        ApiError::malformed(format!(
            "the body is not the JSON expected: {}",
            quoted(&error.to_string())
        ))
    })
}

/// Query parameters; 400 when they do not parse.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Params(value))
            .map_err(|rejection| ApiError::malformed(quoted(&rejection.body_text()).to_string()))
    }
}

/// The `Idempotency-Key` header of a writing route: the request id its
/// command is recorded under, so a retry after a lost answer is answered
/// from the first attempt (`opledger_engine::RequestId`); none when
/// absent. 400 when it is not 1 to 200 visible ASCII characters.
pub struct IdempotencyKey(pub Option<RequestId>);

/// The header's name.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl IdempotencyKey {
    /// `actor`'s command context, carrying the key when given.
    pub fn context(&self, actor: impl Into<String>) -> CommandContext {
        let context = CommandContext::actor(actor);
        match &self.0 {
            Some(request_id) => context.with_request_id(request_id.clone()),
            None => context,
        }
    }

    /// Refuses the key on a route that takes many items in one call (422):
    /// one key names one command.
    pub fn refuse(&self, route: &str) -> ApiResult<()> {
        match &self.0 {
            Some(_) => Err(ApiError::invalid(format!(
                "{route} takes many items and no Idempotency-Key: send each item on its own route with a key"
            ))),
            None => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(IDEMPOTENCY_KEY) else {
            return Ok(IdempotencyKey(None));
        };
        let text = value
            .to_str()
            .map_err(|_| ApiError::malformed("the Idempotency-Key header is not visible ASCII"))?;
        RequestId::new(text)
            .map(|request_id| IdempotencyKey(Some(request_id)))
            .map_err(|error| ApiError::malformed(format!("Idempotency-Key: {error}")))
    }
}

/// An id from the path: 400 when it is not a UUID.
pub fn parse_uuid(what: &str, text: &str) -> ApiResult<uuid::Uuid> {
    uuid::Uuid::parse_str(text).map_err(|_| ApiError::malformed(format!("{what} {} is not a UUID", quoted(text))))
}
