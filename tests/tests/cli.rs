//! The command lines an operator types work as typed (docs/operations.md, Runbook):
//! `serve`'s flags without `serve`, connection flags before or after a subcommand, and
//! operator commands that fail loudly — naming what is wrong — instead of doing nothing.

use charges_tests::kafka::TestKafka;
use charges_tests::outbox::{insert_dead, insert_pending};
use charges_tests::{Process, TestDb, binary};
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
    let poisoned = insert_dead(&db, &kafka).await;

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

/// Rows an outage killed before outages stopped counting as attempts: `dead requeue
/// --unavailable` takes exactly those whose last error says the broker was unavailable,
/// in the texts of this relay and of the relays before it, and leaves the rest dead.
#[tokio::test]
async fn requeue_unavailable_takes_exactly_the_rows_an_outage_killed() {
    let db = TestDb::new().await;
    let errors = [
        (
            "Message production error: MessageTimedOut (Local: Message timed out)",
            true,
        ),
        ("no acknowledgement within 5s", true),
        (
            "unavailable: AllBrokersDown (Local: All broker connections are down)",
            true,
        ),
        (
            "Message production error: MessageSizeTooLarge (Broker: Message size too large)",
            false,
        ),
        ("rejected: InvalidRecord (Broker: Invalid record)", false),
        ("something no relay ever wrote", false),
    ];
    let ids = insert_pending(&db, errors.len() as i32, 10).await;
    for (id, (error, _)) in ids.iter().zip(errors) {
        db.client()
            .execute(
                "UPDATE outbox SET dead_at = now(), attempts = 10, last_error = $2 WHERE id = $1",
                &[id, &error],
            )
            .await
            .expect("make the row dead");
    }
    let (code, out, err) = run(
        "charges-relay",
        &["dead", "requeue", "--unavailable"],
        db.url.as_str(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("requeued 3"), "{out}");
    for (id, (error, requeued)) in ids.iter().zip(errors) {
        let dead: bool = db
            .client()
            .query_one(
                "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1",
                &[id],
            )
            .await
            .expect("read the row")
            .get(0);
        assert_eq!(dead, !requeued, "last error {error:?}");
    }
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
