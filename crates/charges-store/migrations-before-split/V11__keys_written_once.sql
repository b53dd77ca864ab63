-- A key's row is now inserted once, COMPLETED with its response, after the operation's
-- writes (IdempotencyKeyComplete), instead of inserted STARTED and updated. Nothing
-- updates a key on the request path any more, so the free fifth that V9 kept on each
-- page for that update only made the table larger. New pages are filled whole; pages
-- written before keep their room until retention empties them.
--
-- Rolling deploy: run this migration, then the API. An API built before V11 still
-- writes STARTED and updates its rows; both versions take the same advisory lock per
-- key, so they can run side by side.
ALTER TABLE idempotency_keys SET (fillfactor = 100);
