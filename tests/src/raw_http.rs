//! HTTP/1.1 byte for byte on a raw TCP connection: what reqwest would refuse to send
//! (hostile heads and bodies).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What came back on a raw connection.
#[derive(Debug)]
pub enum Raw {
    /// A status line (and everything read after it).
    Answer(u16, String),
    /// Closed or reset without an answer.
    Closed,
    /// Nothing within the limit.
    Hung,
}

/// One header line, `name: value` (the value as raw bytes).
pub fn header(name: &str, value: impl AsRef<[u8]>) -> Vec<u8> {
    let mut line = format!("{name}: ").into_bytes();
    line.extend_from_slice(value.as_ref());
    line
}

/// One HTTP/1.1 request, byte for byte, with `Connection: close` so that the answer
/// ends with the connection.
pub fn raw_request(method: &str, path: &[u8], headers: &[Vec<u8>], body: &[u8]) -> Vec<u8> {
    let mut request = format!("{method} ").into_bytes();
    request.extend_from_slice(path);
    request.extend_from_slice(b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for line in headers {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

/// The status of an HTTP/1.1 answer, if `response` starts with a status line.
pub fn status_of(response: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(response);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

/// The body of an answer read off a raw connection (after the blank line).
pub fn body_of(text: &str) -> &str {
    text.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

/// Sends `request` on a new connection and reads until the server closes it, at most
/// `limit`.
pub async fn raw_exchange(addr: &str, request: &[u8], limit: Duration) -> Raw {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return Raw::Closed;
    };
    // The server may stop reading (a head that is too large) and close: not an error.
    let _ = stream.write_all(request).await;
    let mut response = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buffer = [0_u8; 8192];
        while let Ok(n) = stream.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..n]);
        }
    })
    .await;
    match status_of(&response) {
        Some(status) => Raw::Answer(status, String::from_utf8_lossy(&response).into_owned()),
        None if read.is_err() => Raw::Hung,
        None => Raw::Closed,
    }
}

/// `raw` with every byte but ASCII letters, digits and `-` percent-encoded.
pub fn percent_encode(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
