//! Hostile input against the real `charges-api`, on raw connections: heads and bodies
//! reqwest would refuse to send, SQL meta-characters in every string the API reads, and
//! clients that are slow, stall or go idle. Every hostile request is refused with a 4xx
//! (or the connection closed), none executes the key it names, and the invariant
//! checker of the chaos suite finds nothing wrong afterwards (no 5xx, no stray rows).
//!
//! Fast, so part of `make test`.

use std::time::{Duration, Instant};

use charges_tests::chaos::Answer;
use charges_tests::chaos::hostile::{
    Case, Expect, HostileRun, INVALID_BODY, VALID, json, with_key,
};
use charges_tests::new_key;
use charges_tests::raw_http::{header, percent_encode, raw_request, status_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Heads: size and count (actix: 128 KiB head buffer, 96 headers), repeated, NUL and
/// non-UTF-8 header values, and ambiguous framing. A large header that fits is just a
/// header: the request is served.
#[tokio::test]
async fn hostile_headers_are_refused_with_a_4xx() {
    let mut run = HostileRun::start().await;
    let mut many_keys = vec![json()];
    many_keys.extend((0..100).map(|_| with_key(&new_key())));
    let mut some_keys = vec![json()];
    some_keys.extend((0..40).map(|_| with_key(&new_key())));
    let mut cases: Vec<Case> = vec![
        (
            "one 200 KiB header".into(),
            run.post_with_key(&[header("X-Pad", "a".repeat(200 * 1024))], VALID),
            Expect::Refused,
        ),
        (
            "2000 small headers".into(),
            raw_request(
                "POST",
                b"/charges",
                &(0..2000)
                    .map(|i| header(&format!("X-H{i}"), "v"))
                    .collect::<Vec<_>>(),
                VALID,
            ),
            Expect::Refused,
        ),
        (
            "100 Idempotency-Key headers".into(),
            raw_request("POST", b"/charges", &many_keys, VALID),
            Expect::Refused,
        ),
        (
            "40 Idempotency-Key headers".into(),
            raw_request("POST", b"/charges", &some_keys, VALID),
            Expect::Problem(400, "/problems/invalid-idempotency-key"),
        ),
        (
            "a NUL in the Idempotency-Key header".into(),
            raw_request(
                "POST",
                b"/charges",
                &[json(), header("Idempotency-Key", b"\0abc")],
                VALID,
            ),
            Expect::Refused,
        ),
        // Framing: both Content-Length and chunked (request smuggling).
        (
            "Content-Length with Transfer-Encoding: chunked".into(),
            [
                b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".as_slice(),
                b"Content-Type: application/json\r\nContent-Length: 4\r\n",
                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ]
            .concat(),
            Expect::Refused,
        ),
    ];
    // Bytes that are not UTF-8 (obs-text) where the API reads text.
    for (name, line) in [
        (
            "Idempotency-Key",
            header("Idempotency-Key", b"\xff\xfe-not-utf8"),
        ),
        (
            "Content-Type",
            header("Content-Type", b"application/json\xff"),
        ),
        ("X-Request-Id", header("X-Request-Id", b"\xff\xfe\xfd")),
    ] {
        let mut headers = vec![line];
        if name != "Content-Type" {
            headers.push(json());
        }
        if name != "Idempotency-Key" {
            headers.push(with_key(&run.key));
        }
        let expect = match name {
            "Idempotency-Key" => Expect::Problem(400, "/problems/invalid-idempotency-key"),
            "Content-Type" => Expect::Problem(415, "/problems/unsupported-media-type"),
            // A request id that is not text is replaced; the body is still refused
            // (the key must stay free for the test's last step).
            _ => Expect::Problem(400, INVALID_BODY),
        };
        let body: &[u8] = if name == "X-Request-Id" { b"{}" } else { VALID };
        cases.push((
            format!("non-UTF-8 bytes in {name}"),
            raw_request("POST", b"/charges", &headers, body),
            expect,
        ));
    }
    run.send(&cases).await;
    let big_but_fine = run.post_with_key(&[header("X-Pad", "a".repeat(64 * 1024))], VALID);
    let faults = run.figures();
    run.finish(
        "hostile headers",
        big_but_fine,
        "a 64 KiB header on a valid request",
        &faults,
    )
    .await;
}

/// Bodies: deep nesting under and over the body limit (16 KiB), NUL bytes raw and
/// escaped.
#[tokio::test]
async fn hostile_bodies_are_refused_with_a_4xx() {
    let mut run = HostileRun::start().await;
    let deep_array = format!(
        r#"{{"amountCents":{}{}}}"#,
        "[".repeat(6000),
        "]".repeat(6000)
    );
    let deep_object = format!(
        r#"{{"amountCents":1,"currency":{}1{}}}"#,
        r#"{"a":"#.repeat(2000),
        "}".repeat(2000)
    );
    let cases: Vec<Case> = vec![
        (
            "6000 nested arrays".into(),
            run.post_with_key(&[], deep_array.as_bytes()),
            Expect::Problem(400, INVALID_BODY),
        ),
        (
            "2000 nested objects".into(),
            run.post_with_key(&[], deep_object.as_bytes()),
            Expect::Problem(400, INVALID_BODY),
        ),
        (
            "40 000 nested arrays (over the body limit)".into(),
            run.post_with_key(&[], "[".repeat(40_000).as_bytes()),
            Expect::Problem(413, "/problems/payload-too-large"),
        ),
        (
            "a raw NUL in a JSON string".into(),
            run.post_with_key(&[], b"{\"amountCents\":4900,\"currency\":\"EU\0\"}"),
            Expect::Problem(400, INVALID_BODY),
        ),
        (
            "an escaped NUL in a field name".into(),
            run.post_with_key(&[], br#"{"amount\u0000Cents":4900}"#),
            Expect::Problem(400, INVALID_BODY),
        ),
    ];
    run.send(&cases).await;
    let (valid, faults) = (run.post_with_key(&[], VALID), run.figures());
    run.finish("hostile bodies", valid, "a valid request", &faults)
        .await;
}

const SQL: &[&str] = &[
    "'; DROP TABLE charges; --",
    "\" OR \"\"=\"",
    "1' OR '1'='1",
    "$$; DELETE FROM outbox; $$",
    "\\'; TRUNCATE idempotency_keys CASCADE; --",
    "%_%' UNION SELECT * FROM pg_user --",
];

/// SQL meta-characters in every string the API reads (body fields and names, the key,
/// the content type, charge ids in paths), and NUL in a path.
#[tokio::test]
async fn sql_meta_characters_and_nul_in_paths_are_refused_with_a_4xx() {
    let mut run = HostileRun::start().await;
    let mut cases: Vec<Case> = vec![
        (
            "a NUL in the path".into(),
            raw_request("GET", b"/charges/\0", &[], b""),
            Expect::Refused,
        ),
        (
            "a percent-encoded NUL as the charge id".into(),
            raw_request("GET", b"/charges/%00", &[], b""),
            Expect::Problem(400, "/problems/invalid-charge-id"),
        ),
    ];
    for (i, sql) in SQL.iter().enumerate() {
        let literal = serde_json::to_string(sql).expect("JSON string");
        let id = percent_encode(sql);
        let invalid = Expect::Problem(400, INVALID_BODY);
        cases.extend([
            (
                format!("SQL #{i} as currency"),
                run.post_with_key(
                    &[],
                    format!(r#"{{"amountCents":4900,"currency":{literal}}}"#).as_bytes(),
                ),
                invalid,
            ),
            (
                format!("SQL #{i} as amountCents"),
                run.post_with_key(&[], format!(r#"{{"amountCents":{literal}}}"#).as_bytes()),
                invalid,
            ),
            (
                format!("SQL #{i} as a field name"),
                run.post_with_key(
                    &[],
                    format!(r#"{{"amountCents":4900,{literal}:1}}"#).as_bytes(),
                ),
                invalid,
            ),
            (
                format!("SQL #{i} as the Idempotency-Key"),
                raw_request("POST", b"/charges", &[json(), with_key(sql)], VALID),
                Expect::Problem(400, "/problems/invalid-idempotency-key"),
            ),
            (
                format!("SQL #{i} in the Content-Type"),
                raw_request(
                    "POST",
                    b"/charges",
                    &[
                        header("Content-Type", format!("application/json{sql}")),
                        with_key(&run.key),
                    ],
                    VALID,
                ),
                Expect::Problem(415, "/problems/unsupported-media-type"),
            ),
            (
                format!("SQL #{i} as the charge id of GET"),
                raw_request("GET", format!("/charges/{id}").as_bytes(), &[], b""),
                Expect::Problem(400, "/problems/invalid-charge-id"),
            ),
            (
                format!("SQL #{i} as the charge id of a refund"),
                raw_request(
                    "POST",
                    format!("/charges/{id}/refunds").as_bytes(),
                    &[json(), with_key(&run.key)],
                    b"{}",
                ),
                Expect::Problem(400, "/problems/invalid-charge-id"),
            ),
        ]);
    }
    run.send(&cases).await;
    let (valid, faults) = (run.post_with_key(&[], VALID), run.figures());
    run.finish("SQL meta-characters", valid, "a valid request", &faults)
        .await;
}

/// A slow client gets 408 or is closed once --client-request-timeout has passed; a
/// stalled body gets a 400 problem within it (found by this suite: the body read had no
/// bound at all, the connection and the request stayed open forever; now the body gets
/// --client-request-timeout too); an idle keep-alive connection is closed after
/// --keep-alive.
#[tokio::test]
async fn slow_stalled_and_idle_clients_are_cut_off() {
    let client_request_timeout = Duration::from_secs(1);
    let keep_alive = Duration::from_secs(1);
    let run = HostileRun::start().await;
    let (addr, key) = (run.addr.as_str(), run.key.as_str());

    // A slow client: headers dribbled one line every 200 ms never make a request; the
    // server answers 408 (or closes) once --client-request-timeout has passed.
    let slow_started = Instant::now();
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write the request line");
    let mut slow_response = Vec::new();
    let mut buffer = [0_u8; 1024];
    for i in 0..50 {
        if slow
            .write_all(format!("X-Slow-{i}: a\r\n").as_bytes())
            .await
            .is_err()
        {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buffer)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => slow_response.extend_from_slice(&buffer[..n]),
        }
    }
    let cut_off_after = slow_started.elapsed();
    let slow_status = status_of(&slow_response);
    assert!(
        cut_off_after < client_request_timeout + Duration::from_secs(3),
        "a slow client kept its connection for {cut_off_after:?}"
    );
    assert!(
        matches!(slow_status, None | Some(408)),
        "slow client answered {slow_status:?}"
    );

    // A slow body: the head arrives, the body stops short of its Content-Length.
    let stalled_started = Instant::now();
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
    let mut stalled_response = Vec::new();
    let _ = tokio::time::timeout(client_request_timeout * 2 + Duration::from_secs(3), async {
        while let Ok(n) = stalled.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            stalled_response.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&stalled_response).contains("\r\n\r\n{") {
                break;
            }
        }
    })
    .await;
    let stalled_after = stalled_started.elapsed();
    let stalled_status = status_of(&stalled_response);
    match stalled_status {
        Some(status) => run.ledger.record(
            None,
            &Answer::raw(
                status,
                String::from_utf8_lossy(&stalled_response).into_owned(),
            ),
        ),
        None => run.ledger.violation(format!(
            "a stalled body got no answer within {stalled_after:?}"
        )),
    }
    assert_eq!(stalled_status, Some(400), "a stalled body");
    assert!(
        stalled_after < client_request_timeout * 2 + Duration::from_secs(2),
        "a stalled body was cut off after {stalled_after:?}"
    );

    // Keep-alive: an idle connection is closed after --keep-alive.
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).ends_with("ok\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buffer))
            .await
            .expect("an answer to /healthz")
            .expect("read");
        assert!(n > 0, "closed before answering /healthz");
        got.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(status_of(&got), Some(200));
    let idle_since = Instant::now();
    let closed = tokio::time::timeout(keep_alive + Duration::from_secs(4), idle.read(&mut buffer))
        .await
        .expect("an idle keep-alive connection must be closed");
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "expected the connection to close, read {closed:?}"
    );
    let idle_closed_after = idle_since.elapsed();

    let faults = format!(
        "slow client cut off after {} ms (status {slow_status:?}); stalled body answered \
         {stalled_status:?} after {} ms; idle keep-alive closed after {} ms",
        cut_off_after.as_millis(),
        stalled_after.as_millis(),
        idle_closed_after.as_millis()
    );
    let valid = run.post_with_key(&[], VALID);
    run.finish("slow clients", valid, "a valid request", &faults)
        .await;
}
