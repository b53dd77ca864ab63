-- With --ordering per-aggregate: the highest sequence applied per charge, so that an
-- event arriving before its predecessor is noticed (and counted). Updated in the same
-- transaction as the inbox row and the effect.
CREATE TABLE aggregate_positions (
    aggregate_id  UUID   PRIMARY KEY,
    last_sequence BIGINT NOT NULL
);
