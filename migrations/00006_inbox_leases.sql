-- +goose Up
-- A lease on a key whose effect is a call to another service (an SMS gateway): the worker that holds
-- it makes the call outside any transaction, and no other worker calls for the key until the lease is
-- released or has expired. The row is deleted in the transaction that writes the key's inbox row, or
-- when the message fails for good; a failed call only expires it, keeping its count of attempts. A row
-- left by a worker that died stays live until expires_at; the next claim then takes it over.
CREATE TABLE inbox_leases (
    handler          text        NOT NULL,
    idempotency_key  text        NOT NULL,
    holder           text        NOT NULL,          -- the claim holding it: host, pid, a random part
    expires_at       timestamptz NOT NULL,           -- free to take over from then on
    attempts         integer     NOT NULL CHECK (attempts >= 1), -- calls for the key so far, the current included
    claimed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, idempotency_key)
);

-- +goose Down
DROP TABLE inbox_leases;
