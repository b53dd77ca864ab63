//! Why a message was not acknowledged, sorted into the two kinds that the relay treats
//! differently (docs/design.md, "Outages are not attempts"):
//!
//! - [`FailureKind::Unavailable`] — *not now, or not this relay*: the broker or cluster
//!   could not take the message (down, unreachable, no leader, not enough replicas,
//!   throttled, timed out), or refuses this relay (authentication, authorization,
//!   producer fenced). Nothing about the message is wrong; it is retried for as long
//!   as it takes and never moves towards dead.
//! - [`FailureKind::Rejected`] — *not this message*: the broker, or librdkafka before
//!   it, refuses the message itself (too large, invalid record, a timestamp outside
//!   the topic's bounds). Sending it again cannot help; only these count towards
//!   [`RelaySettings::max_attempts`] and can make a row dead.
//!
//! The rejections are listed; every other error code is an availability error. A code
//! this list does not know therefore never kills an event: the worst it does is keep
//! a row pending (and an alert on the oldest pending row's age fires), where the
//! opposite mistake would turn an outage into dead rows.
//!
//! [`RelaySettings::max_attempts`]: crate::relay::RelaySettings::max_attempts

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    Unavailable,
    Rejected,
}

/// Error codes that say "this message can never be published".
pub const REJECTIONS: &[RDKafkaErrorCode] = &[
    RDKafkaErrorCode::MessageSizeTooLarge, // 10: larger than message.max.bytes
    RDKafkaErrorCode::InvalidMessageSize,  // 4
    RDKafkaErrorCode::MessageBatchTooLarge, // 18: record batch over the broker's limit
    RDKafkaErrorCode::InvalidMessage,      // 2: CRC or format check failed
    RDKafkaErrorCode::InvalidRecord,       // 87: the broker's record validation
    RDKafkaErrorCode::InvalidTimestamp,    // 32: outside the topic's timestamp bounds
    RDKafkaErrorCode::PolicyViolation,     // 44: a topic policy refuses the record
    RDKafkaErrorCode::BadMessage,          // -199: librdkafka cannot frame it
    RDKafkaErrorCode::KeySerialization,    // -162
    RDKafkaErrorCode::ValueSerialization,  // -161
    RDKafkaErrorCode::InvalidDifferentRecord, // -138
];

/// Availability errors that say this relay's producer, not the broker, is stuck: the
/// broker no longer accepts its producer id, epoch or sequence numbers (after
/// in-flight messages timed out, for example). Every later message of that producer
/// fails the same way; a new producer (a new producer id) does not.
pub const PRODUCER_STATE_ERRORS: &[RDKafkaErrorCode] = &[
    RDKafkaErrorCode::ProducerFenced,
    RDKafkaErrorCode::InvalidProducerEpoch,
    RDKafkaErrorCode::InvalidProducerIdMapping,
    RDKafkaErrorCode::UnknownProducerId,
    RDKafkaErrorCode::OutOfOrderSequenceNumber,
    RDKafkaErrorCode::Fenced,
    RDKafkaErrorCode::Fatal,
];

/// A failed publish of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishError {
    pub kind: FailureKind,
    pub message: String,
    /// The producer that sent it is stuck ([`PRODUCER_STATE_ERRORS`]).
    pub producer_stuck: bool,
}

impl PublishError {
    /// The broker could not take the message now: not the message's fault.
    pub fn unavailable(message: impl Into<String>) -> PublishError {
        PublishError {
            kind: FailureKind::Unavailable,
            message: message.into(),
            producer_stuck: false,
        }
    }

    /// Sorts an error librdkafka reported for one message.
    pub fn from_kafka(error: &KafkaError) -> PublishError {
        let code = error.rdkafka_error_code();
        let kind = match code {
            Some(code) if REJECTIONS.contains(&code) => FailureKind::Rejected,
            _ => FailureKind::Unavailable,
        };
        PublishError {
            kind,
            message: error.to_string(),
            producer_stuck: code.is_some_and(|code| PRODUCER_STATE_ERRORS.contains(&code)),
        }
    }

    /// What `outbox.last_error` stores: the kind first, so that operators (and a
    /// requeue of the rows an outage killed, [`kind_of_stored_error`]) can tell the two
    /// apart.
    pub fn stored_text(&self) -> String {
        format!("{}: {}", kind_prefix(self.kind), self.message)
    }
}

fn kind_prefix(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::Unavailable => "unavailable",
        FailureKind::Rejected => "rejected",
    }
}

/// The kind of a stored `last_error`: written by [`PublishError::stored_text`], or by a
/// relay older than this classification (`Message production error: <Code> (…)`, or
/// the relay's own timeout texts), which counted every failure towards dead. `None`
/// when the text says nothing this relay recognises.
pub fn kind_of_stored_error(text: &str) -> Option<FailureKind> {
    for kind in [FailureKind::Unavailable, FailureKind::Rejected] {
        if text.starts_with(&format!("{}: ", kind_prefix(kind))) {
            return Some(kind);
        }
    }
    if text.starts_with("no acknowledgement within") || text == "the producer dropped the message" {
        return Some(FailureKind::Unavailable);
    }
    let code = text
        .strip_prefix("Message production error: ")?
        .split(' ')
        .next()?;
    Some(if REJECTIONS.iter().any(|r| format!("{r:?}") == code) {
        FailureKind::Rejected
    } else {
        FailureKind::Unavailable
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_unavailable_and_bad_messages_rejected() {
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::LeaderNotAvailable,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::NotEnoughReplicasAfterAppend,
            RDKafkaErrorCode::ThrottlingQuotaExceeded,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::SaslAuthenticationFailed,
            RDKafkaErrorCode::Authentication,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::QueueFull,
        ] {
            let error = PublishError::from_kafka(&KafkaError::MessageProduction(code));
            assert_eq!(error.kind, FailureKind::Unavailable, "{code:?}");
            assert_eq!(
                kind_of_stored_error(&error.stored_text()),
                Some(FailureKind::Unavailable)
            );
            assert_eq!(
                kind_of_stored_error(&error.message),
                Some(FailureKind::Unavailable),
                "{code:?}: the text an older relay stored"
            );
        }
        for &code in REJECTIONS {
            let error = PublishError::from_kafka(&KafkaError::MessageProduction(code));
            assert_eq!(error.kind, FailureKind::Rejected, "{code:?}");
            assert_eq!(
                kind_of_stored_error(&error.message),
                Some(FailureKind::Rejected),
                "{code:?}"
            );
        }
        assert_eq!(
            kind_of_stored_error("no acknowledgement within 5s"),
            Some(FailureKind::Unavailable)
        );
        assert_eq!(kind_of_stored_error("something else"), None);
    }
}
