//! The event schemas under `schemas/events/` are the contract with downstream teams:
//! what the code writes validates against them (so does every event any test reads from
//! a topic, through `TopicReader`), and a released schema never changes in a way that
//! breaks a consumer unless it becomes a new version.

use charges_domain::{Charge, ChargeCreated, ChargeRefunded, EventType, Refund};
use charges_tests::schemas::{self, breaking_changes, properties, released};
use chrono::Utc;
use uuid::Uuid;

fn charge() -> Charge {
    Charge {
        id: Uuid::now_v7(),
        amount_cents: 4900,
        currency: "EUR".to_owned(),
        created_at: Utc::now(),
    }
}

#[test]
fn the_events_the_code_writes_validate_against_their_schemas() {
    let charge = charge();
    let created = ChargeCreated::new(Uuid::now_v7(), &charge);
    let refund = Refund {
        id: Uuid::now_v7(),
        charge_id: charge.id,
        amount_cents: 900,
        currency: charge.currency.clone(),
        created_at: Utc::now(),
    };
    let refunded = ChargeRefunded::new(Uuid::now_v7(), &refund, 900, 2);
    for (event_type, payload) in [
        (
            EventType::ChargeCreated,
            serde_json::to_vec(&created).unwrap(),
        ),
        (
            EventType::ChargeRefunded,
            serde_json::to_vec(&refunded).unwrap(),
        ),
    ] {
        schemas::validate(event_type.data_schema(), &payload)
            .unwrap_or_else(|e| panic!("{event_type:?}: {e}"));
    }
    // And a payload that breaks it is refused: the check can fail.
    let mut broken = serde_json::to_value(&created).unwrap();
    broken["amountCents"] = serde_json::json!("4900");
    assert!(
        schemas::validate(
            EventType::ChargeCreated.data_schema(),
            &serde_json::to_vec(&broken).unwrap()
        )
        .is_err()
    );
}

#[test]
fn every_schema_is_named_after_its_id_and_every_event_type_has_one() {
    let files = schemas::files();
    for (name, schema) in &files {
        let id = schema["$id"].as_str().expect("$id");
        let (kind, version) = name.split_once('/').expect("kind/version");
        assert_eq!(
            id,
            format!("urn:charges:schemas:events:{kind}:{version}"),
            "{name}: the file's place and its $id disagree"
        );
    }
    for event_type in EventType::ALL {
        assert!(
            files
                .iter()
                .any(|(_, s)| s["$id"] == event_type.data_schema()),
            "{event_type:?} writes {} but no file has that $id",
            event_type.data_schema()
        );
    }
}

#[test]
fn released_schemas_keep_every_promise() {
    let promised = released();
    let mut current = Vec::new();
    for (name, schema) in schemas::files() {
        let properties = properties(&name, &schema);
        let unreleased: Vec<String> = properties
            .iter()
            .filter(|p| {
                !promised
                    .iter()
                    .any(|r| r.schema == p.schema && r.name == p.name)
            })
            .map(ToString::to_string)
            .collect();
        assert!(
            unreleased.is_empty(),
            "{name} has properties that released.txt does not list (add them when \
             releasing): \n{}",
            unreleased.join("\n")
        );
        current.extend(properties);
    }
    let problems = breaking_changes(&promised, &current);
    assert!(
        problems.is_empty(),
        "a released schema changed in a way that breaks consumers; make it a new version \
         (a new vN.json) instead:\n{}",
        problems.join("\n")
    );
}

/// The compatibility check itself: each kind of breaking change is caught, and adding
/// an optional property is not one.
#[test]
fn the_compatibility_check_catches_each_breaking_change() {
    let (name, schema) = schemas::files()
        .into_iter()
        .find(|(name, _)| name == "charge-created/v1")
        .expect("charge-created/v1");
    // Only this schema's promises: the check sees one schema's file.
    let promised: Vec<_> = released()
        .into_iter()
        .filter(|p| p.schema == name)
        .collect();
    let check = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut changed = schema.clone();
        edit(&mut changed);
        breaking_changes(&promised, &properties(&name, &changed))
    };
    let removed = check(&|s| {
        s["properties"].as_object_mut().unwrap().remove("currency");
    });
    assert!(
        removed.iter().any(|p| p.contains("currency: removed")),
        "{removed:?}"
    );
    let retyped = check(&|s| s["properties"]["amountCents"]["type"] = "string".into());
    assert!(
        retyped.iter().any(|p| p.contains("amountCents: type")),
        "{retyped:?}"
    );
    let new_required = check(&|s| {
        s["properties"]["merchantId"] = serde_json::json!({"type": "string"});
        s["required"]
            .as_array_mut()
            .unwrap()
            .push("merchantId".into());
    });
    assert!(
        new_required
            .iter()
            .any(|p| p.contains("merchantId: a new required")),
        "{new_required:?}"
    );
    let made_optional = check(&|s| {
        s["required"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r != "occurredAt");
    });
    assert!(
        made_optional
            .iter()
            .any(|p| p.contains("occurredAt: required became optional")),
        "{made_optional:?}"
    );
    let new_optional = check(&|s| {
        s["properties"]["note"] = serde_json::json!({"type": "string"});
    });
    assert!(new_optional.is_empty(), "{new_optional:?}");
}
