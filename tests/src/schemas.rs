//! The event schemas under `schemas/events/`: every event a test reads from a topic is
//! validated against the schema its `ce_dataschema` names (`kafka::TopicReader` calls
//! [`validate`]), and the released ones are checked for compatibility.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

/// `schemas/events/` in the repository.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../schemas/events")
}

/// Every schema file: `(name, e.g. charge-created/v1, the parsed schema)`.
pub fn files() -> Vec<(String, Value)> {
    let mut found = Vec::new();
    for kind in std::fs::read_dir(dir()).expect("schemas/events") {
        let kind = kind.expect("a directory entry").path();
        if !kind.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&kind).expect("a schema directory") {
            let path = file.expect("a schema file").path();
            if path.extension().is_some_and(|e| e == "json") {
                found.push((name_of(&path), read(&path)));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

fn name_of(path: &Path) -> String {
    let kind = path.parent().and_then(Path::file_name).expect("kind");
    let version = path.file_stem().expect("version");
    format!("{}/{}", kind.to_string_lossy(), version.to_string_lossy())
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn validators() -> &'static BTreeMap<String, jsonschema::Validator> {
    static VALIDATORS: OnceLock<BTreeMap<String, jsonschema::Validator>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        files()
            .into_iter()
            .map(|(name, schema)| {
                let id = schema["$id"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: no $id"))
                    .to_owned();
                let validator = jsonschema::options()
                    .should_validate_formats(true)
                    .build(&schema)
                    .unwrap_or_else(|e| panic!("{name} is not a valid JSON Schema: {e}"));
                (id, validator)
            })
            .collect()
    })
}

static VALIDATED: AtomicUsize = AtomicUsize::new(0);

/// Validates `payload` against the schema whose `$id` is `schema_id`; an error names the
/// schema and every violation.
pub fn validate(schema_id: &str, payload: &[u8]) -> Result<(), String> {
    let validator = validators()
        .get(schema_id)
        .ok_or_else(|| format!("no schema under schemas/events has the $id {schema_id}"))?;
    let value: Value = serde_json::from_slice(payload)
        .map_err(|e| format!("not JSON ({e}): {}", String::from_utf8_lossy(payload)))?;
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    if !errors.is_empty() {
        return Err(format!("{schema_id}: {} in {value}", errors.join("; ")));
    }
    VALIDATED.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// How many payloads this test process validated so far.
pub fn validated() -> usize {
    VALIDATED.load(Ordering::Relaxed)
}

/// One line of `released.txt`: a property as consumers rely on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Property {
    pub schema: String,
    pub name: String,
    pub kind: String,
    pub required: bool,
}

impl std::fmt::Display for Property {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let required = if self.required {
            "required"
        } else {
            "optional"
        };
        write!(f, "{} {} {} {required}", self.schema, self.name, self.kind)
    }
}

/// The properties of schema `name` as its file has them now.
pub fn properties(name: &str, schema: &Value) -> Vec<Property> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut found: Vec<Property> = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(property, definition)| Property {
            schema: name.to_owned(),
            name: property.clone(),
            kind: definition["type"].as_str().unwrap_or("any").to_owned(),
            required: required.contains(&property.as_str()),
        })
        .collect();
    found.sort();
    found
}

/// The released properties (`released.txt`).
pub fn released() -> Vec<Property> {
    let text = std::fs::read_to_string(dir().join("released.txt")).expect("released.txt");
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [schema, name, kind, required] = fields[..] else {
                panic!(
                    "released.txt: {line:?} is not `<schema> <property> <type> required|optional`"
                );
            };
            Property {
                schema: schema.to_owned(),
                name: name.to_owned(),
                kind: kind.to_owned(),
                required: required == "required",
            }
        })
        .collect()
}

/// What would break a consumer of the released `promised` properties if the schemas
/// were `current`: a property gone or retyped, a required one made optional, an
/// optional one made required, a required one added.
pub fn breaking_changes(promised: &[Property], current: &[Property]) -> Vec<String> {
    let mut problems = Vec::new();
    for old in promised {
        match current
            .iter()
            .find(|p| p.schema == old.schema && p.name == old.name)
        {
            None => problems.push(format!("{} {}: removed", old.schema, old.name)),
            Some(new) if new.kind != old.kind => problems.push(format!(
                "{} {}: type {} became {}",
                old.schema, old.name, old.kind, new.kind
            )),
            Some(new) if new.required != old.required => problems.push(format!(
                "{} {}: {} became {}",
                old.schema,
                old.name,
                if old.required { "required" } else { "optional" },
                if new.required { "required" } else { "optional" },
            )),
            Some(_) => {}
        }
    }
    for new in current.iter().filter(|p| p.required) {
        let released_schema = promised.iter().any(|p| p.schema == new.schema);
        let known = promised
            .iter()
            .any(|p| p.schema == new.schema && p.name == new.name);
        if released_schema && !known {
            problems.push(format!(
                "{} {}: a new required property",
                new.schema, new.name
            ));
        }
    }
    problems
}
