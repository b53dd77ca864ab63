//! Every number and duration flag of every binary refuses a bad value at start-up: a
//! usage error (exit code 2) that names the flag, before anything connects anywhere.
//! The flags are read from each binary's `--help` (every flag whose default is a number
//! or a duration), so a new flag is walked without anyone adding it here. The
//! configuration tables of docs/operations.md and docs/consumers.md say what `--help`
//! and the parsers say, row by row: environment variable, default, range.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};

use charges_tests::binary;
use charges_tests::manifests::repo;

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

/// The configuration tables of the documents, `(file, heading, binary)`: every row is
/// compared with the binary's `--help` and parser, cell by cell.
const TABLES: &[(&str, &str, &str)] = &[
    ("docs/operations.md", "### `charges-api`", "charges-api"),
    ("docs/operations.md", "### `charges-relay`", "charges-relay"),
    (
        "docs/consumers.md",
        "### Configuration (`charges-consumer`)",
        "charges-consumer",
    ),
];

/// One row of a configuration table: `| flag | env | default | range | meaning |`.
#[derive(Debug)]
struct Row {
    /// The subcommand words before the flag (`dead list`).
    words: Vec<String>,
    /// `None` for a positional argument or a bare subcommand (`dead show <id>`, `purge`).
    flag: Option<String>,
    env: String,
    default: String,
    range: String,
}

fn table_rows(doc: &str, heading: &str) -> Vec<Row> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(heading));
    assert!(lines.next().is_some(), "no heading {heading:?}");
    let mut rows = Vec::new();
    for line in lines {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        let Some(inner) = line.strip_prefix('|').and_then(|l| l.strip_suffix('|')) else {
            continue;
        };
        let cells: Vec<&str> = inner.split('|').map(str::trim).collect();
        if cells[0] == "flag" {
            assert_eq!(
                cells,
                ["flag", "env", "default", "range", "meaning"],
                "{heading}: the columns"
            );
            continue;
        }
        if cells[0].starts_with("---") {
            continue;
        }
        assert_eq!(cells.len(), 5, "{heading}: a row of five cells: {line}");
        let words: Vec<&str> = cells[0].trim_matches('`').split_whitespace().collect();
        let flag = words.iter().find(|w| w.starts_with("--"));
        rows.push(Row {
            words: words
                .iter()
                .take_while(|w| w.starts_with(|c: char| c.is_ascii_lowercase()))
                .map(|w| (*w).to_owned())
                .collect(),
            flag: flag.map(|f| (*f).to_owned()),
            env: cells[1].to_owned(),
            default: cells[2].to_owned(),
            range: cells[3].to_owned(),
        });
    }
    rows
}

/// One flag as `--help` shows it.
#[derive(Debug, Default)]
struct HelpEntry {
    text: String,
    env: Option<String>,
    default: Option<String>,
}

/// `--help` of `binary words…`: its flags, and its subcommands (`Commands:`).
fn help_of(binary_name: &str, words: &[String]) -> (BTreeMap<String, HelpEntry>, Vec<String>) {
    let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
    args.push("--help");
    let output = run(binary_name, &args);
    assert!(output.status.success(), "{binary_name} {args:?} failed");
    let help = String::from_utf8(output.stdout).expect("utf-8 help");
    let (mut entries, mut commands) = (BTreeMap::new(), Vec::new());
    let mut current: Option<String> = None;
    let mut in_commands = false;
    for line in help.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if indent == 0 {
            current = None;
            in_commands = trimmed == "Commands:";
        } else if in_commands && indent == 2 {
            commands.extend(trimmed.split_whitespace().next().map(str::to_owned));
        } else if indent <= 6 && trimmed.starts_with('-') {
            current = trimmed
                .split([' ', ',', '='])
                .find(|w| w.starts_with("--"))
                .map(str::to_owned);
            if let Some(flag) = &current {
                entries
                    .entry(flag.clone())
                    .or_insert_with(HelpEntry::default);
            }
        }
        let Some(entry) = current.as_ref().and_then(|f| entries.get_mut(f)) else {
            continue;
        };
        entry.text.push_str(trimmed);
        entry.text.push('\n');
        if let Some(at) = line.find("[env: ") {
            let rest = &line[at + 6..];
            entry.env = Some(rest[..rest.find(['=', ']']).unwrap_or(rest.len())].to_owned());
        }
        if let Some(at) = line.find("[default: ") {
            let rest = &line[at + 10..];
            entry.default = Some(rest[..rest.find(']').unwrap_or(rest.len())].to_owned());
        }
    }
    commands.retain(|c| c != "help");
    (entries, commands)
}

/// A number, or a duration in milliseconds.
fn magnitude(text: &str) -> Option<(Kind, u64)> {
    let kind = kind_of(text)?;
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let ms_per_unit = match &text[digits.len()..] {
        "" => return Some((kind, n)),
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => 86_400_000,
    };
    Some((kind, n * ms_per_unit))
}

fn value_text(kind: Kind, n: u64) -> String {
    match kind {
        Kind::Number => n.to_string(),
        Kind::Duration => format!("{n}ms"),
    }
}

/// Whether the parser of `binary words… flag` takes `value` (`--help` after it: the
/// value is parsed, nothing runs).
fn accepts(binary_name: &str, words: &[String], flag: &str, value: &str) -> bool {
    let assignment = format!("{flag}={value}");
    let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
    args.extend([assignment.as_str(), "--help"]);
    let output = run(binary_name, &args);
    match output.status.code() {
        Some(0) => true,
        Some(2) => {
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(stderr.contains(flag), "{args:?}: {stderr}");
            false
        }
        code => panic!("{binary_name} {args:?}: exit {code:?}"),
    }
}

/// The range cell, `A–B` or `≥ A`, is exactly what the parser takes: both bounds are
/// taken, a value just outside is refused.
fn check_range(binary_name: &str, row: &Row, flag: &str, what: &str) {
    let (low, high) = match row.range.strip_prefix("≥ ") {
        Some(low) => (low, None),
        None => {
            let (low, high) = row
                .range
                .split_once('–')
                .unwrap_or_else(|| panic!("{what}: range {:?} is neither A–B nor ≥ A", row.range));
            (low, Some(high))
        }
    };
    let (kind, low) = magnitude(low).unwrap_or_else(|| panic!("{what}: bound {low:?}"));
    let words = &row.words;
    assert!(
        accepts(binary_name, words, flag, &value_text(kind, low)),
        "{what}: the lower bound is refused"
    );
    let below = if low == 0 {
        "-1".to_owned() + if kind == Kind::Duration { "ms" } else { "" }
    } else {
        value_text(kind, low - 1)
    };
    assert!(
        !accepts(binary_name, words, flag, &below),
        "{what}: {below} is taken"
    );
    if let Some(high) = high {
        let (_, high) = magnitude(high).unwrap_or_else(|| panic!("{what}: bound {high:?}"));
        assert!(
            accepts(binary_name, words, flag, &value_text(kind, high)),
            "{what}: the upper bound is refused"
        );
        let above = value_text(kind, high + 1);
        assert!(
            !accepts(binary_name, words, flag, &above),
            "{what}: {above} is taken"
        );
    }
}

/// One row against `--help`: the environment variable, the default and the range.
fn check_row(binary_name: &str, row: &Row, entries: &BTreeMap<String, HelpEntry>) {
    let command: Vec<&str> = std::iter::once(binary_name)
        .chain(row.words.iter().map(String::as_str))
        .chain(row.flag.as_deref())
        .collect();
    let what = command.join(" ");
    let Some(flag) = &row.flag else {
        assert_eq!(row.env, "(none)", "{what}: env");
        assert!(row.range.is_empty(), "{what}: range");
        return;
    };
    let entry = entries
        .get(flag)
        .unwrap_or_else(|| panic!("{what}: not in --help"));
    let env = row.env.split('`').nth(1);
    assert_eq!(env, entry.env.as_deref(), "{what}: env {:?}", row.env);
    if env.is_none() {
        assert_eq!(row.env, "(none)", "{what}: env");
    }
    match entry.default.as_deref() {
        Some("false") => assert_eq!(row.default, "off", "{what}: default"),
        Some(default) => assert!(
            row.default.starts_with(&format!("`{default}`")),
            "{what}: default {:?}, --help says {default}",
            row.default
        ),
        // A default the parser does not show (it depends on another flag) must be the
        // one its help text names: "`outbox-id` (the default without ordering)".
        None => {
            if let Some(named) = row
                .default
                .strip_prefix('`')
                .and_then(|d| d.split('`').next())
            {
                assert!(
                    entry.text.contains(&format!("`{named}` (the default")),
                    "{what}: default {named}, which --help does not name"
                );
            }
        }
    }
    let numeric = entry.default.as_deref().and_then(kind_of).is_some()
        || NUMBERS_WITHOUT_DEFAULT.contains(&flag.as_str());
    if row.range.is_empty() {
        assert!(!numeric, "{what}: a number or duration without a range");
    } else {
        check_range(binary_name, row, flag, &what);
    }
}

/// The configuration tables in docs/ cannot drift from the binaries: every flag of every
/// command is in its binary's table, and each row's environment variable, default and
/// range are the ones `--help` shows and the parser applies.
#[test]
fn the_documents_configuration_tables_match_the_binaries() {
    for (file, heading, binary_name) in TABLES {
        let doc = std::fs::read_to_string(repo().join(file))
            .unwrap_or_else(|e| panic!("read {file}: {e}"));
        let rows = table_rows(&doc, heading);
        let (root, commands) = help_of(binary_name, &[]);
        let mut undocumented: BTreeSet<String> = root.keys().cloned().collect();
        for command in &commands {
            assert!(
                rows.iter().any(|r| r.words.first() == Some(command)),
                "{file}: no row for `{binary_name} {command}`"
            );
        }
        let mut pages = BTreeMap::from([(Vec::new(), root)]);
        for row in &rows {
            let entries = pages
                .entry(row.words.clone())
                .or_insert_with(|| help_of(binary_name, &row.words).0);
            undocumented.extend(entries.keys().cloned());
            check_row(binary_name, row, entries);
        }
        for row in &rows {
            undocumented.remove(row.flag.as_deref().unwrap_or_default());
        }
        undocumented.retain(|f| f != "--help" && f != "--version");
        assert!(
            undocumented.is_empty(),
            "{file} {heading}: no row for {undocumented:?}"
        );
    }
}
