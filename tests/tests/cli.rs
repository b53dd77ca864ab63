//! The command lines an operator types work as typed (docs/operations.md, Runbook):
//! `serve`'s flags without `serve`, connection flags before or after a subcommand, and
//! operator commands that fail loudly — naming what is wrong — instead of doing nothing.

use charges_tests::kafka::TestKafka;
use charges_tests::outbox::insert_pending;
use charges_tests::{Process, TestDb, binary, start_relay};
use uuid::Uuid;

fn run(name: &str, args: &[&str], database_url: &str) -> (Option<i32>, String, String) {
    let output = std::process::Command::new(binary(name))
        .args(args)
        .env("DATABASE_URL", database_url)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_api_serves_with_serves_flags_and_no_subcommand() {
    let db = TestDb::new().await;
    let (_api, line) = Process::start(
        "charges-api",
        &["--listen", "127.0.0.1:0", "--database-url", db.url.as_str()],
        &[],
        "listening",
    )
    .await;
    assert!(line.contains("127.0.0.1:"), "{line}");
}

#[tokio::test]
async fn relay_commands_take_the_database_before_or_after_the_subcommand() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let elsewhere = "postgres://postgres@127.0.0.1:1/none";
    for args in [
        vec!["--database-url", url, "dead", "list"],
        vec!["dead", "--database-url", url, "list"],
        vec!["dead", "list", "--database-url", url],
    ] {
        let (code, out, err) = run("charges-relay", &args, elsewhere);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(out.starts_with("id\t"), "{args:?}: {out}");
    }
}

#[tokio::test]
async fn dead_row_commands_name_what_is_wrong() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let url = db.url.as_str();
    let poisoned = insert_pending(&db, 1, 20_000).await[0];
    let (mut relay, _) = start_relay(
        &db,
        &kafka,
        &[
            "--kafka-config",
            "message.max.bytes=10000",
            "--max-attempts",
            "1",
        ],
    )
    .await;
    db.wait_for(
        "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1",
        &[&poisoned],
        "the row is dead",
    )
    .await;
    relay.stop().await;

    let (code, out, _) = run(
        "charges-relay",
        &["dead", "show", &poisoned.to_string()],
        url,
    );
    assert_eq!(code, Some(0));
    for field in [
        "payload:",
        "\"pad\"",
        "rejections:   1",
        "last_error:   rejected: ",
    ] {
        assert!(out.contains(field), "dead show lacks {field}:\n{out}");
    }

    let unknown = Uuid::new_v4().to_string();
    let (code, _, err) = run("charges-relay", &["dead", "show", &unknown], url);
    assert_eq!(code, Some(1));
    assert!(err.contains(&unknown), "{err}");

    let (code, _, err) = run(
        "charges-relay",
        &[
            "dead",
            "requeue",
            "--id",
            &poisoned.to_string(),
            "--id",
            &unknown,
        ],
        url,
    );
    assert_eq!(code, Some(1), "an unknown id among the ids");
    assert!(
        err.contains(&unknown) && !err.contains(&poisoned.to_string()),
        "{err}"
    );
    db.wait_for(
        "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1",
        &[&poisoned],
        "nothing was requeued",
    )
    .await;

    let (code, _, err) = run("charges-relay", &["dead", "requeue"], url);
    assert_eq!(code, Some(2));
    for option in ["--id", "--all", "--unavailable", "--last-error-like"] {
        assert!(
            err.contains(option),
            "`dead requeue` alone does not mention {option}:\n{err}"
        );
    }

    let (code, out, err) = run(
        "charges-relay",
        &[
            "dead",
            "requeue",
            "--last-error-like",
            "rejected: %MessageSizeTooLarge%",
        ],
        url,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("requeued 1"), "{out}");
}

#[tokio::test]
async fn tail_of_a_topic_that_does_not_exist_is_an_error() {
    let kafka = TestKafka::new(1).await;
    let (code, out, err) = run(
        "charges-consumer",
        &[
            "tail",
            "--kafka-brokers",
            kafka.bootstrap.as_str(),
            "--topic",
            "no.such.topic",
        ],
        "postgres://postgres@127.0.0.1:1/none",
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("no.such.topic does not exist"), "{err}");
}
