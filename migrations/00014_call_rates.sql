-- +goose Up
-- The schedule of a call route's rate limit, shared by the consumer group's instances: each books
-- the next calls it is about to make, spaced one per 1/rate after all those already booked, so that
-- the group keeps to the rate wherever its traffic is and whoever joins or dies. A row per group
-- and route; booked_until is the time after which nothing is booked yet.
CREATE TABLE inbox_call_rates (
    consumer_group  text        NOT NULL,
    handler         text        NOT NULL,
    booked_until    timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, handler)
);

-- +goose Down
DROP TABLE inbox_call_rates;
