//! HTTP/1.1 byte for byte on a raw TCP connection: what reqwest would refuse to send
//! (hostile heads and bodies), and clients that are slow, stall or go idle.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::DEADLINE;

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

/// How a client that never finished its head was let go.
#[derive(Debug)]
pub struct CutOff {
    /// The server closed the connection or answered (rather than `limit` passing).
    pub by_the_server: bool,
    /// The status, if the server answered.
    pub status: Option<u16>,
    /// From connecting to being let go.
    pub after: Duration,
}

/// A slow client: the request line, then header lines dribbled one byte every 200 ms
/// (a head that never completes, nor grows too large or to too many headers within a
/// minute), until the server answers or closes the connection, at most `limit`.
pub async fn dribble_a_head(addr: &str, limit: Duration) -> CutOff {
    let started = Instant::now();
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write the request line");
    let lines = (0..).flat_map(|i| format!("X-Slow-{i}: a\r\n").into_bytes());
    let mut response = Vec::new();
    let mut buffer = [0_u8; 1024];
    let mut by_the_server = false;
    for byte in lines {
        if started.elapsed() > limit {
            break;
        }
        if slow.write_all(&[byte]).await.is_err() {
            by_the_server = true;
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buffer)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => {
                by_the_server = true;
                break;
            }
            Ok(Ok(n)) => response.extend_from_slice(&buffer[..n]),
        }
    }
    CutOff {
        by_the_server,
        status: status_of(&response),
        after: started.elapsed(),
    }
}

/// A stalled body: the head arrives, the body stops short of its `Content-Length`.
/// Reads until an answer's body starts or the connection closes, at most `limit`;
/// returns what was read and how long it took.
pub async fn stall_a_body(addr: &str, key: &str, limit: Duration) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut stalled = TcpStream::connect(addr).await.expect("connect");
    stalled
        .write_all(
            format!(
                "POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Idempotency-Key: {key}\r\nContent-Length: 100\r\n\r\n{{\"amountCents\":1"
            )
            .as_bytes(),
        )
        .await
        .expect("write a partial request");
    let mut response = Vec::new();
    let mut buffer = [0_u8; 1024];
    let _ = tokio::time::timeout(limit, async {
        while let Ok(n) = stalled.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&response).contains("\r\n\r\n{") {
                break;
            }
        }
    })
    .await;
    (response, started.elapsed())
}

/// An idle keep-alive connection: one `GET /healthz` answered 200, then nothing. Returns
/// how long after the answer the server closed it; panics if it did not within `limit`.
pub async fn idle_after_one_request(addr: &str, limit: Duration) -> Duration {
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    let mut buffer = [0_u8; 1024];
    while !String::from_utf8_lossy(&got).ends_with("ok\n") {
        let n = tokio::time::timeout(DEADLINE, idle.read(&mut buffer))
            .await
            .expect("an answer to /healthz")
            .expect("read");
        assert!(n > 0, "closed before answering /healthz");
        got.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(status_of(&got), Some(200));
    let idle_since = Instant::now();
    let closed = tokio::time::timeout(limit, idle.read(&mut buffer))
        .await
        .expect("an idle keep-alive connection must be closed");
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "expected the connection to close, read {closed:?}"
    );
    idle_since.elapsed()
}
