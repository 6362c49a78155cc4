package inboxworker_test

import (
	"context"
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
