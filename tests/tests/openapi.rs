//! openapi.yaml agrees with the running server: every operation in the file is served,
//! and every status code and documented header the server answers a scripted set of
//! requests with is listed for that operation (and every problem `type` is in the
//! file's list).

use std::collections::BTreeSet;
use std::path::PathBuf;

use charges_tests::{TestApi, TestDb, new_key};
use serde_json::Value;
use uuid::Uuid;

/// The headers this API defines or relies on; when the server sends one, the file must
/// declare it for that status.
const DOCUMENTED_HEADERS: &[&str] = &[
    "location",
    "idempotent-replayed",
    "retry-after",
    "x-request-id",
];

fn spec() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../openapi.yaml");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Follows a local `$ref` (`#/components/…`), once.
fn resolve<'a>(spec: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("only local $refs: {reference}"));
            spec.pointer(pointer)
                .unwrap_or_else(|| panic!("dangling $ref {reference}"))
        }
        None => value,
    }
}

/// The file's operations as `(method, path template)`.
fn operations(spec: &Value) -> Vec<(String, String)> {
    let paths = spec["paths"].as_object().expect("paths");
    let mut operations = Vec::new();
    for (path, item) in paths {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                operations.push((method.clone(), path.clone()));
            }
        }
    }
    operations
}

struct Scripted {
    method: &'static str,
    template: &'static str,
    path: String,
    key: Option<String>,
    content_type: &'static str,
    body: String,
}

fn post(template: &'static str, path: String, key: Option<&str>, body: &str) -> Scripted {
    Scripted {
        method: "post",
        template,
        path,
        key: key.map(str::to_owned),
        content_type: "application/json",
        body: body.to_owned(),
    }
}

fn get(template: &'static str, path: String) -> Scripted {
    Scripted {
        method: "get",
        template,
        path,
        key: None,
        content_type: "application/json",
        body: String::new(),
    }
}

async fn send(api: &TestApi, request: &Scripted) -> reqwest::Response {
    let url = api.url(&request.path);
    let mut builder = match request.method {
        "get" => api.http.get(url),
        _ => api
            .http
            .post(url)
            .header("content-type", request.content_type)
            .body(request.body.clone()),
    };
    if let Some(key) = &request.key {
        builder = builder.header("idempotency-key", key);
    }
    builder.send().await.expect("request")
}

#[tokio::test]
async fn every_operation_is_served_and_every_answer_is_documented() {
    let spec = spec();
    assert_eq!(spec["openapi"].as_str(), Some("3.1.0"));
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--max-body-bytes", "1024"]).await;

    // A charge to hang the templated paths on.
    let created = api
        .post_charge(Some(&new_key()), r#"{"amountCents":1000,"currency":"EUR"}"#)
        .await;
    assert_eq!(created.status().as_u16(), 201);
    let charge: Value = created.json().await.expect("charge JSON");
    let id = charge["id"].as_str().expect("charge id").to_owned();

    // 1. Every operation in the file is a route the server serves.
    for (method, template) in operations(&spec) {
        let path = template.replace("{id}", &id);
        let request = if method == "get" {
            get("", path)
        } else {
            post("", path, Some(&new_key()), r#"{"amountCents":1}"#)
        };
        let status = send(&api, &request).await.status().as_u16();
        assert!(
            status != 404 && status != 405,
            "{method} {template} is in openapi.yaml but the server answers {status}"
        );
    }

    // 2. Scripted requests: each answer's status, headers and problem type are documented.
    let problem_types: BTreeSet<String> = spec
        .pointer("/components/schemas/Problem/properties/type/enum")
        .and_then(Value::as_array)
        .expect("the Problem type enum")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let mut seen = BTreeSet::new();
    for request in &script(&id) {
        let response = send(&api, request).await;
        seen.insert(assert_documented(&spec, &problem_types, request, response).await);
    }
    // The script covers the interesting answers, not only the happy path.
    for status in [200, 201, 400, 404, 413, 415, 422] {
        assert!(seen.contains(&status), "the script never produced {status}");
    }
}

/// Requests for every answer worth documenting, on the charge `id`.
fn script(id: &str) -> Vec<Scripted> {
    let key = new_key();
    let refund_key = new_key();
    let big = format!(r#"{{"amountCents":1,"pad":"{}"}}"#, "x".repeat(2048));
    let refunds = format!("/charges/{id}/refunds");
    let unknown = format!("/charges/{}", Uuid::now_v7());
    let mut script = vec![
        post(
            "/charges",
            "/charges".into(),
            Some(&key),
            r#"{"amountCents":4900,"currency":"EUR"}"#,
        ),
        post(
            "/charges",
            "/charges".into(),
            Some(&key),
            r#"{"amountCents":4900,"currency":"eur"}"#,
        ),
        post(
            "/charges",
            "/charges".into(),
            Some(&key),
            r#"{"amountCents":5000,"currency":"EUR"}"#,
        ),
        post("/charges", "/charges".into(), None, r#"{"amountCents":1}"#),
        post(
            "/charges",
            "/charges".into(),
            Some("not-a-uuid"),
            r#"{"amountCents":1}"#,
        ),
        post(
            "/charges",
            "/charges".into(),
            Some(&new_key()),
            r#"{"amountCents":1.5}"#,
        ),
        post("/charges", "/charges".into(), Some(&new_key()), &big),
        get("/charges/{id}", format!("/charges/{id}")),
        get("/charges/{id}", unknown.clone()),
        get("/charges/{id}", "/charges/42".into()),
        post(
            "/charges/{id}/refunds",
            refunds.clone(),
            Some(&refund_key),
            r#"{"amountCents":300}"#,
        ),
        post(
            "/charges/{id}/refunds",
            refunds.clone(),
            Some(&refund_key),
            r#"{"amountCents":300}"#,
        ),
        post(
            "/charges/{id}/refunds",
            refunds.clone(),
            Some(&refund_key),
            r#"{"amountCents":301}"#,
        ),
        post(
            "/charges/{id}/refunds",
            refunds.clone(),
            Some(&new_key()),
            r#"{"amountCents":999999}"#,
        ),
        post(
            "/charges/{id}/refunds",
            format!("{unknown}/refunds"),
            Some(&new_key()),
            "{}",
        ),
        post(
            "/charges/{id}/refunds",
            "/charges/42/refunds".into(),
            Some(&new_key()),
            "{}",
        ),
        get("/healthz", "/healthz".into()),
        get("/readyz", "/readyz".into()),
        get("/metrics", "/metrics".into()),
    ];
    let mut wrong_type = post(
        "/charges",
        "/charges".into(),
        Some(&new_key()),
        "amountCents=1",
    );
    wrong_type.content_type = "application/x-www-form-urlencoded";
    script.push(wrong_type);

    script
}

/// The answer's status is listed for its operation, every header of
/// [`DOCUMENTED_HEADERS`] it carries is declared for that status, and a problem's
/// `type` is one of `problem_types`. Returns the status.
async fn assert_documented(
    spec: &Value,
    problem_types: &BTreeSet<String>,
    request: &Scripted,
    response: reqwest::Response,
) -> u16 {
    let status = response.status().as_u16();
    let what = format!(
        "{} {} → {status}",
        request.method.to_uppercase(),
        request.path
    );
    let operation = &spec["paths"][request.template][request.method];
    assert!(
        operation.is_object(),
        "{what}: no such operation in openapi.yaml"
    );
    let documented = operation["responses"]
        .get(status.to_string())
        .unwrap_or_else(|| panic!("{what}: status {status} is not listed in openapi.yaml"));
    let documented = resolve(spec, documented);
    let declared: BTreeSet<String> = documented["headers"]
        .as_object()
        .map(|headers| headers.keys().map(|k| k.to_ascii_lowercase()).collect())
        .unwrap_or_default();
    for header in DOCUMENTED_HEADERS {
        if response.headers().contains_key(*header) {
            assert!(
                declared.contains(*header),
                "{what}: the server sends {header} but openapi.yaml does not declare it"
            );
        }
    }
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await.expect("body");
    if content_type.starts_with("application/problem+json") {
        let problem: Value = serde_json::from_str(&body).expect("problem JSON");
        let kind = problem["type"].as_str().unwrap_or_default();
        assert!(
            problem_types.contains(kind),
            "{what}: problem type {kind} is not in openapi.yaml"
        );
    }
    status
}

/// `CreateCharge.currency` lists exactly the codes the server accepts (the ISO 4217 table
/// of the `iso_currency` crate it validates with), so a client generated from the file
/// offers every code and nothing that is refused; any letter case of one is accepted.
#[test]
fn the_currency_enum_is_exactly_what_the_server_accepts() {
    let spec = spec();
    let listed: BTreeSet<String> = spec
        .pointer("/components/schemas/CreateCharge/properties/currency/enum")
        .and_then(Value::as_array)
        .expect("the currency enum")
        .iter()
        .map(|v| v.as_str().expect("a currency code").to_owned())
        .collect();
    let letters = b'A'..=b'Z';
    let mut accepted = BTreeSet::new();
    for a in letters.clone() {
        for b in letters.clone() {
            for c in letters.clone() {
                let code = String::from_utf8(vec![a, b, c]).expect("ASCII");
                if charges_domain::CreateCharge::new(1, Some(&code)).is_ok() {
                    accepted.insert(code);
                }
            }
        }
    }
    assert_eq!(
        listed.difference(&accepted).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "listed in openapi.yaml but refused by the server"
    );
    assert_eq!(
        accepted.difference(&listed).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "accepted by the server but missing from openapi.yaml"
    );
    for code in &listed {
        let lower = code.to_ascii_lowercase();
        let created = charges_domain::CreateCharge::new(1, Some(&lower)).expect("lower case");
        assert_eq!(created.currency(), code);
    }
}
