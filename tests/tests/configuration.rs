//! Every number and duration flag of every binary refuses a bad value at start-up: a
//! usage error (exit code 2) that names the flag, before anything connects anywhere.
//! The flags are read from each binary's `--help` (every flag whose default is a number
//! or a duration), so a new flag is walked without anyone adding it here.

use std::process::{Command, Output};

use charges_tests::binary;

/// Where a mistake would otherwise lead: nothing listens there, so a binary that got
/// past its validation fails to connect (exit code 1), not with a usage error.
const UNREACHABLE_DATABASE: &str = "postgres://postgres@127.0.0.1:1/none";

/// `(binary, subcommand)`: every command line whose flags are walked.
const COMMANDS: &[(&str, &[&str])] = &[
    ("charges-api", &[]),
    ("charges-api", &["serve"]),
    ("charges-relay", &[]),
    ("charges-relay", &["dead", "list"]),
    ("charges-consumer", &[]),
    ("charges-consumer", &["tail"]),
];

/// Flags whose bad values differ from their kind's: 0 is a documented value for these.
const ZERO_ALLOWED: &[(&str, &[&str])] = &[
    ("--replay-cache-entries", &["-1", "many", "99999999999"]),
    ("--commit-interval", &["-1s", "2h", "soon"]),
];

/// Flags without a default that take a number.
const NUMBERS_WITHOUT_DEFAULT: &[&str] = &["--workers"];

fn run(binary_name: &str, args: &[&str]) -> Output {
    Command::new(binary(binary_name))
        .args(args)
        .env("DATABASE_URL", UNREACHABLE_DATABASE)
        .env("KAFKA_BROKERS", "127.0.0.1:1")
        .env_remove("USER")
        .output()
        .unwrap_or_else(|e| panic!("run {binary_name}: {e}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Number,
    Duration,
}

fn kind_of(default: &str) -> Option<Kind> {
    let digits = default.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if default.is_empty() || digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    match &default[digits.len()..] {
        "" => Some(Kind::Number),
        "ms" | "s" | "m" | "h" | "d" => Some(Kind::Duration),
        _ => None,
    }
}

/// `(flag, kind)` for every flag of `--help` whose default is a number or a duration.
fn walked_flags(binary_name: &str, sub: &[&str]) -> Vec<(String, Kind)> {
    let mut args = sub.to_vec();
    args.push("--help");
    let help = String::from_utf8(run(binary_name, &args).stdout).expect("utf-8 help");
    let mut flags = Vec::new();
    let mut current: Option<String> = None;
    for line in help.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            current = Some(format!("--{name}"));
            if NUMBERS_WITHOUT_DEFAULT.contains(&current.as_deref().unwrap_or_default()) {
                flags.push((format!("--{name}"), Kind::Number));
            }
        }
        if let (Some(flag), Some(start)) = (&current, line.find("[default: ")) {
            let default = line[start + 10..].split(']').next().unwrap_or_default();
            if let Some(kind) = kind_of(default) {
                flags.push((flag.clone(), kind));
            }
        }
    }
    flags.sort();
    flags.dedup();
    flags
}

fn bad_values(flag: &str, kind: Kind) -> &'static [&'static str] {
    if let Some((_, values)) = ZERO_ALLOWED.iter().find(|(f, _)| *f == flag) {
        return values;
    }
    match kind {
        Kind::Number => &["0", "-1", "many", "99999999999"],
        Kind::Duration => &["0s", "-1s", "soon", "10000000d"],
    }
}

fn assert_usage_error(binary_name: &str, args: &[&str], names: &str) {
    let output = run(binary_name, args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{binary_name} {args:?} was accepted (exit {:?}):\n{stderr}",
        output.status.code()
    );
    assert!(
        stderr.contains(names),
        "{binary_name} {args:?}: the error does not name {names}:\n{stderr}"
    );
}

#[test]
fn every_number_and_duration_flag_refuses_bad_values() {
    let mut walked = 0;
    for (binary_name, sub) in COMMANDS {
        let flags = walked_flags(binary_name, sub);
        assert!(
            !flags.is_empty(),
            "{binary_name} {sub:?}: no flag found in --help"
        );
        for (flag, kind) in flags {
            for value in bad_values(&flag, kind) {
                // `--flag=-1s`: a separate `-1s` would be read as a flag of its own.
                let assignment = format!("{flag}={value}");
                let mut args = sub.to_vec();
                args.push(&assignment);
                assert_usage_error(binary_name, &args, &flag);
                walked += 1;
            }
        }
    }
    // 3 API durations + 3 numbers, 10 relay durations + 3 numbers, …: a parser that
    // found nothing would pass quietly otherwise.
    assert!(walked >= 100, "only {walked} bad values tried");
}

#[test]
fn settings_that_only_break_together_are_refused_too() {
    for (binary_name, args, names) in [
        (
            "charges-api",
            &["--idempotency-ttl", "1m", "--db-statement-timeout", "1m"][..],
            "--idempotency-ttl",
        ),
        (
            "charges-relay",
            &["--backoff-base", "2s", "--backoff-max", "1s"][..],
            "--backoff-max",
        ),
        (
            "charges-relay",
            &["--backoff-base", "2m", "--broker-probe-max", "1m"][..],
            "--broker-probe-max",
        ),
        (
            "charges-relay",
            &["--poll-interval", "1s", "--busy-poll-interval", "2s"][..],
            "--busy-poll-interval",
        ),
        (
            "charges-relay",
            &["--ordering", "per-aggregate", "--message-key", "outbox-id"][..],
            "--ordering per-aggregate",
        ),
        (
            "charges-relay",
            &["--batch-size", "5", "dead", "list"][..],
            "--batch-size",
        ),
        (
            "charges-api",
            &["--listen", "127.0.0.1:0", "migrate"][..],
            "--listen",
        ),
    ] {
        assert_usage_error(binary_name, args, names);
    }
}

/// The values every binary ships with pass the same validation (they would fail to
/// connect, exit code 1, not 2).
#[test]
fn the_defaults_are_valid() {
    for (binary_name, args) in [
        ("charges-api", &[][..]),
        ("charges-relay", &[][..]),
        ("charges-consumer", &["--metrics-listen", "127.0.0.1:0"][..]),
    ] {
        let output = run(binary_name, args);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{binary_name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
