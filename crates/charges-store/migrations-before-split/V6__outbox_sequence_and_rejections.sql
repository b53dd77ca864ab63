-- Per-charge event order, and outages that never kill an event (docs/design.md, "The
-- relay"). Additive: binaries built before V6 keep working during a rolling deploy
-- (their events have a NULL sequence and are published unordered).

-- The number of the charge's latest event: 1 for ChargeCreated, then one more per
-- refund. Assigned under the charge's row lock, which already serializes its writes,
-- so sequence order is commit order.
ALTER TABLE charges ADD COLUMN event_sequence BIGINT NOT NULL DEFAULT 1;

-- The event's place among its charge's events; NULL only for rows written before V6
-- that were published already.
ALTER TABLE outbox ADD COLUMN sequence BIGINT;

-- Failed attempts the broker refused the message itself (too large, invalid): only
-- these count towards --max-attempts. `attempts` keeps counting every failure,
-- outages included.
ALTER TABLE outbox ADD COLUMN rejections INTEGER NOT NULL DEFAULT 0;

-- Charges refunded before V6: as many events as refunds, plus ChargeCreated.
UPDATE charges c
   SET event_sequence = 1 + r.refunds
  FROM (SELECT charge_id, count(*) AS refunds FROM refunds GROUP BY charge_id) r
 WHERE r.charge_id = c.id;

-- Unpublished rows (pending or dead) get their sequence, so ordered delivery holds for
-- them too: ChargeCreated is 1, a refund 1 + the refunds of its charge up to itself.
UPDATE outbox o
   SET sequence = CASE
         WHEN o.event_type = 'ChargeCreated' THEN 1
         ELSE 1 + (SELECT count(*) FROM refunds r, refunds this
                    WHERE this.id = (o.payload ->> 'refundId')::uuid
                      AND r.charge_id = this.charge_id
                      AND (r.created_at, r.id) <= (this.created_at, this.id))
       END
 WHERE o.published_at IS NULL;

-- One sequence number per charge (NULLs aside), and the index the ordered claim's
-- "is an older event of this charge unpublished?" probe and reconciliation's "does
-- this charge have its event?" use; it replaces outbox_aggregate_idx.
CREATE UNIQUE INDEX outbox_aggregate_sequence_idx ON outbox (aggregate_id, sequence);
DROP INDEX outbox_aggregate_idx;
