-- Refunds of a charge. charges.refunded_cents is the running total, updated under
-- the charge's row lock in the refund's transaction, so concurrent refunds of one
-- charge are serialized and can never add up past the charged amount; the CHECK is
-- the last line of defence if code ever forgets the lock.

ALTER TABLE charges
    ADD COLUMN refunded_cents INTEGER NOT NULL DEFAULT 0,
    ADD CONSTRAINT charges_refunded_within_amount
        CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents);

CREATE TABLE refunds (
    id            UUID PRIMARY KEY,
    charge_id     UUID NOT NULL REFERENCES charges (id),
    amount_cents  INTEGER NOT NULL CHECK (amount_cents > 0),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX refunds_charge_idx ON refunds (charge_id, created_at);
