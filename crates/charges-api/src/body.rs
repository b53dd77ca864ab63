//! Reading a JSON request body within the documented limits.

use actix_web::http::header;
use actix_web::{HttpRequest, web};
use futures::StreamExt;

use crate::problem::ApiError;

/// `application/json`, with or without parameters such as `charset=utf-8`.
pub fn require_json(request: &HttpRequest) -> Result<(), ApiError> {
    let essence = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType),
    }
}

/// Reads at most `limit` bytes; a declared or actual larger body is refused as soon as
/// that is known, without buffering it. The whole body must arrive within `timeout`:
/// actix's client request timeout only covers the head, so a body that stops short of
/// its Content-Length would otherwise hold the connection and the request forever.
pub async fn read_limited(
    request: &HttpRequest,
    payload: web::Payload,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<web::BytesMut, ApiError> {
    actix_web::rt::time::timeout(timeout, read_within(request, payload, limit))
        .await
        .map_err(|_elapsed| ApiError::UnreadableBody)?
}

async fn read_within(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| ApiError::UnreadableBody)?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
