// Package inspect is worker inspect: everything the database knows of one idempotency key, on one
// screen. For each route that knows it: the key's inbox row (when it was recorded, from which topic,
// partition and offset, until when it is remembered), what its effect left in the route's own tables
// (for payments the payments row, the anomalies and the state of the order, with the provider
// transaction's binding; for SMS the notifications row, its number masked), the key's parked
// messages with their retry history, its dead letters kept in the table dead_letters, and its call
// lease; then one line saying what became of the message.
//
// It reads Postgres only, in one read-only transaction (a consistent snapshot of every table), and
// needs no broker: dead letters that their dead-letter topic took are in Kafka, where worker replay
// --dry-run lists them. It changes nothing and decides nothing; it reads the tables as the
// migrations define them. No payload is printed whole: a phone number is masked, an SMS's params
// are not shown, and a callback is shown by its fields.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/replay"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// Kind says which business tables a route's effects are written to.
type Kind int

const (
	// Payments routes apply payment callbacks: orders, payments, payment_anomalies and
	// payment_transactions.
	Payments Kind = iota + 1
	// SMS routes send SMS: notifications, and the call leases.
	SMS
)

// Route is one consumed topic, as the worker wires it.
type Route struct {
	// Name is the route's name in the inbox (its handler column): "payments", "sms".
	Name string
	// Topic is the topic it consumes, whose dead letters are looked at.
	Topic string
	Kind  Kind
}

// Config is one run of worker inspect.
type Config struct {
	// Key is the idempotency key to look for. Required.
	Key string
	// Route, when set, is the name or topic of the one route to look in; otherwise every route is.
	Route string
	// Routes are the worker's routes. Required.
	Routes []Route
	// DLQSuffix names the dead-letter topics, for the hints. Defaults to ".dlq".
	DLQSuffix string
	// Postgres says where the database is. Required.
	Postgres startup.Postgres
	// Out receives the report. Required.
	Out io.Writer
}

// ErrUnknownKey is returned (wrapped, saying where it looked) when no route knows the key.
var ErrUnknownKey = errors.New("unknown idempotency key")

// Run prints what the database knows of cfg.Key. It returns an error wrapping ErrUnknownKey,
// having printed nothing, when nothing does.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Key == "" {
		return errors.New("missing the idempotency key (see worker inspect --help)")
	}
	routes, err := pick(cfg.Routes, cfg.Route)
	if err != nil {
		return err
	}
	pool, err := startup.OpenPostgres(ctx, cfg.Postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	var report Report
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			report, err = read(ctx, tx, cfg.Key, routes)
			return err
		})
	if err != nil {
		return fmt.Errorf("read what the database knows of the key: %w", err)
	}
	if !report.Known() {
		return fmt.Errorf("%w %s: no inbox row, parked message, stored dead letter, lease or effect of it in %s "+
			"(a key purged after its retention, or a dead letter in a dead-letter topic, leaves no trace in the database)",
			ErrUnknownKey, replay.Displayed(cfg.Key), names(routes))
	}
	suffix := cfg.DLQSuffix
	if suffix == "" {
		suffix = ".dlq"
	}
	return report.write(cfg.Out, suffix)
}

// pick returns the routes to look in: the one named name (by its name or its topic), or all.
func pick(routes []Route, name string) ([]Route, error) {
	if name == "" {
		return routes, nil
	}
	for _, r := range routes {
		if r.Name == name || r.Topic == name {
			return []Route{r}, nil
		}
	}
	return nil, fmt.Errorf("--route: no route %q (routes: %s)", name, names(routes))
}

// names lists the routes as "payments (payments.callbacks), sms (notifications.sms)".
func names(routes []Route) string {
	parts := make([]string, len(routes))
	for i, r := range routes {
		parts[i] = fmt.Sprintf("%s (%s)", r.Name, r.Topic)
	}
	return strings.Join(parts, ", ")
}

// when shows t in UTC to the second, with how long ago (or in how long) it is from now.
func when(t, now time.Time) string {
	d := now.Sub(t).Round(time.Second)
	rel := d.String() + " ago"
	if d < 0 {
		rel = "in " + (-d).String()
	}
	return t.UTC().Format(time.DateTime+"Z") + " (" + rel + ")"
}
