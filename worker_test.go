package inboxworker_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
)

// noop is a Handler that does nothing.
type noop struct{}

func (noop) Handle(context.Context, pgx.Tx, inboxworker.Delivery) error { return nil }

// TestNewRefuses: New refuses, naming the field, a configuration that would lose messages in
// silence: two routes of one name (they would share their idempotency keys, and one route's message
// would be skipped as the other's duplicate), or an event topic that is a route's dead-letter topic.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never connects
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	valid := func() inboxworker.Config {
		return inboxworker.Config{Pool: pool, Brokers: []string{"127.0.0.1:1"}, Routes: []inboxworker.Route{
			{Topic: "t12", Name: "orders", Handler: noop{}},
			{Topic: "t13", Name: "shipments", Handler: noop{}},
		}}
	}
	if _, err := inboxworker.New(valid()); err != nil {
		t.Fatalf("New(valid config) = %v", err)
	}
	tests := []struct {
		name   string
		modify func(*inboxworker.Config)
		want   string
	}{
		{"NameTwice", func(c *inboxworker.Config) { c.Routes[1].Name = "orders" }, "Config.Routes[1].Name"},
		{"EventsToDeadLetters", func(c *inboxworker.Config) { c.EventTopics = []string{"t13.dlq"} }, "Config.EventTopics[0]"},
		{"EventsToOwnSuffix", func(c *inboxworker.Config) {
			c.DLQSuffix = ".dead"
			c.EventTopics = []string{"events", "t12.dead"}
		}, "Config.EventTopics[1]"},
		{"KillSwitchNegative", func(c *inboxworker.Config) { c.KillSwitch.After = -1 }, "Config.KillSwitch.After"},
		{"KillSwitchUnderThreeKeys", func(c *inboxworker.Config) { c.KillSwitch.After = 2 }, "Config.KillSwitch.After"},
		{"KillSwitchRateOverOne", func(c *inboxworker.Config) { c.KillSwitch.Rate = 1.5 }, "Config.KillSwitch.Rate"},
		{"TimeoutTooShort", func(c *inboxworker.Config) { c.Routes[0].Timeout = 50 * time.Millisecond }, "Config.Routes[0].Timeout"},
		{"TimeoutTooLong", func(c *inboxworker.Config) { c.Routes[1].Timeout = 2 * time.Hour }, "Config.Routes[1].Timeout"},
		{"CallOutlastsTimeout", func(c *inboxworker.Config) {
			c.Routes[1] = inboxworker.Route{Topic: "t13", Name: "notices", Call: notifier{}, Timeout: 3 * time.Second,
				CallLease: 10 * time.Second}
		}, "Config.Routes[1].CallLease 10s gives its call 6.666666666s, no less than Timeout 3s"},
		{"KillSwitchProbesTooOften", func(c *inboxworker.Config) { c.KillSwitch.MaxProbeInterval = time.Millisecond },
			"Config.KillSwitch.MaxProbeInterval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			config := valid()
			tt.modify(&config)
			if _, err := inboxworker.New(config); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New() = %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

// panicky is a Verifier that panics on a message whose value says so, and verifies the rest.
type panicky struct{}

func (panicky) Verify(m inboxworker.Received) (string, error) {
	if strings.Contains(string(m.Value), "panic-verify") {
		panic("the verifier's bug")
	}
	return "k1", nil
}

// TestTeamFunctions: what a team plugs into a route cannot crash the worker or block its
// partition: a Verifier or a Route.Key that panics on a message, or a key that is no key,
// dead-letters that message with its reason, and the next one goes on; Route.Timeout bounds an
// attempt, which is then retried.
func TestTeamFunctions(t *testing.T) {
	t.Parallel()
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE applied (idempotency_key text PRIMARY KEY, attempt int NOT NULL, verified_by text NOT NULL)`)
	key := func(m inboxworker.Received) (string, error) {
		switch v := string(m.Value); {
		case v == "":
			return "a-key-for-a-tombstone", nil // refused all the same
		case strings.Contains(v, "panic-key"):
			panic("the key function's bug")
		case strings.Contains(v, "empty-key"):
			return "", nil
		case strings.Contains(v, "no-key"):
			return "", errors.New("no order number")
		case strings.Contains(v, "bad-key"):
			return "", inboxworker.Permanent(inboxworker.InvalidPayload, errors.New("not an order"))
		}
		return inboxworker.DefaultKey(m)
	}
	apply := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		if strings.Contains(string(d.Value), "slow") && d.Attempt == 1 {
			<-ctx.Done() // the attempt's Timeout ends it
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3)`, d.Key, d.Attempt, d.VerifiedBy)
		return err
	})
	for _, v := range []string{"panic-verify", "panic-key", "empty-key", "no-key", "bad-key", "slow", "good"} {
		env.produce("shipments", v, `{"event_id":"`+v+`"}`)
	}
	env.produce("shipments", "tombstone", "")
	env.run(inboxworker.Config{
		Routes: []inboxworker.Route{{Topic: "shipments", Name: "shipments", Handler: apply, Verify: panicky{},
			Key: key, Timeout: 200 * time.Millisecond}},
		Retry: inboxworker.Retry{InitialInterval: 10 * time.Millisecond},
	}, 8)

	want := []string{ // in key order: the messages have keys of their own, and run concurrently
		"bad-key invalid_payload: not an order",
		"empty-key invalid_idempotency_key: invalid idempotency key in Route.Key: empty",
		"no-key missing_idempotency_key: no order number",
		"panic-key handler_error: Route.Key panicked: the key function's bug",
		"panic-verify bad_signature: Verifier panicked: the verifier's bug",
		"tombstone invalid_payload: empty value (tombstone): nothing to apply",
	}
	got := env.deadLetters("shipments.dlq", len(want))
	if slices.Sort(got); !slices.Equal(got, want) {
		t.Errorf("dead letters:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	want = []string{"good 1 k1", "slow 2 k1"}
	if got := env.rows(`SELECT idempotency_key || ' ' || attempt || ' ' || verified_by FROM applied ORDER BY 1`); !slices.Equal(got, want) {
		t.Errorf("applied: %q, want %q", got, want)
	}
}
