package inboxworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
)

// A team's own route on its own table: shipment events, each applied once however often it
// arrives. The handler writes through the transaction that records the event's idempotency key,
// so the key is recorded if and only if the shipment is.
func ExampleNew() {
	ctx := context.Background()
	env := setupExample() // a Postgres schema and an embedded Kafka broker, for the example
	defer env.close()

	if err := inboxworker.Migrate(ctx, env.pool); err != nil { // the worker's own tables
		log.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE shipments (order_no text PRIMARY KEY, shipped_at timestamptz)`); err != nil {
		log.Fatal(err)
	}
	ship := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		var event struct {
			OrderNo string `json:"order_no"`
		}
		if err := json.Unmarshal(d.Value, &event); err != nil || event.OrderNo == "" {
			return inboxworker.Permanent(inboxworker.InvalidPayload, errors.New("not a shipment event"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_no, shipped_at) VALUES ($1, now())`, event.OrderNo)
		return err
	})

	w, err := inboxworker.New(inboxworker.Config{
		Brokers: env.brokers,
		Pool:    env.pool,
		Routes:  []inboxworker.Route{{Topic: "shipments", Name: "shipments", Handler: ship}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// The same event, delivered three times (a producer's retries, a redelivery).
	for range 3 {
		env.produce("shipments", "A-1001", `{"event_id":"ship-1","order_no":"A-1001"}`)
	}
	env.waitCommitted("shipments", 3)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	var shipped int
	if err := env.pool.QueryRow(context.Background(), `SELECT count(*) FROM shipments`).Scan(&shipped); err != nil {
		log.Fatal(err)
	}
	fmt.Println("shipments recorded:", shipped)
	// Output: shipments recorded: 1
}

// notifier is a CallHandler: its effect is a call to another service, made with no transaction
// open and carrying the idempotency key, and its completion records the call in the transaction
// of the key's inbox row.
type notifier struct{ url string }

func (n notifier) Check(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	if !json.Valid(d.Value) {
		return inboxworker.Permanent(inboxworker.InvalidPayload, errors.New("not JSON"))
	}
	return nil
}

func (n notifier) Call(ctx context.Context, d inboxworker.Delivery) (inboxworker.Completion, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(d.Value))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", d.Key) // a repeated call with this key is one
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, inboxworker.Retryable(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return nil, inboxworker.Retryable(fmt.Errorf("the service answered %s", resp.Status))
	}
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO notices (idempotency_key) VALUES ($1)`, d.Key)
		return err
	}, nil
}

// A route whose effect is a call to another service: a notice sent once per idempotency key,
// however often its event arrives. The service here counts the calls it gets for each key.
func ExampleCallHandler() {
	ctx := context.Background()
	env := setupExample()
	defer env.close()
	var mu sync.Mutex
	calls := map[string]int{}
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer service.Close()

	if err := inboxworker.Migrate(ctx, env.pool); err != nil {
		log.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE notices (idempotency_key text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	w, err := inboxworker.New(inboxworker.Config{
		Brokers: env.brokers,
		Pool:    env.pool,
		Routes:  []inboxworker.Route{{Topic: "notices", Name: "notices", Call: notifier{url: service.URL}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	env.produce("notices", "user-7", `{"event_id":"notice-1","user":"user-7"}`)
	env.produce("notices", "user-7", `{"event_id":"notice-1","user":"user-7"}`) // delivered again
	env.waitCommitted("notices", 2)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	fmt.Println("calls for notice-1:", calls["notice-1"])
	// Output: calls for notice-1: 1
}

// reminder is a CallHandler whose Check declines what is too old to be of use: a reminder produced
// more than an hour ago is recorded as expired, and not sent.
type reminder struct{ sent *int }

func (r reminder) Check(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	if age := time.Since(d.Produced); age > time.Hour {
		_, err := tx.Exec(ctx, `INSERT INTO reminders (idempotency_key, status) VALUES ($1, 'EXPIRED')`, d.Key)
		if err != nil {
			return err
		}
		return inboxworker.Expired(fmt.Errorf("produced %s ago", age.Round(time.Minute)))
	}
	return nil
}

func (r reminder) Call(ctx context.Context, d inboxworker.Delivery) (inboxworker.Completion, error) {
	*r.sent++ // the call to the other service
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO reminders (idempotency_key, status) VALUES ($1, 'SENT')`, d.Key)
		return err
	}, nil
}

// A call route that makes no call too late to be of use: the reminder produced two hours ago is
// recorded as expired, its key with it, so that a redelivery stays a no-op.
func ExampleExpired() {
	ctx := context.Background()
	env := setupExample()
	defer env.close()
	if err := inboxworker.Migrate(ctx, env.pool); err != nil {
		log.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE reminders (idempotency_key text PRIMARY KEY, status text)`); err != nil {
		log.Fatal(err)
	}
	var sent int
	w, err := inboxworker.New(inboxworker.Config{
		Brokers: env.brokers,
		Pool:    env.pool,
		Routes:  []inboxworker.Route{{Topic: "reminders", Name: "reminders", Call: reminder{sent: &sent}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	env.produceAt("reminders", "user-7", `{"event_id":"stale"}`, time.Now().Add(-2*time.Hour))
	env.produce("reminders", "user-7", `{"event_id":"fresh"}`)
	env.produceAt("reminders", "user-7", `{"event_id":"stale"}`, time.Now().Add(-2*time.Hour)) // again
	env.waitCommitted("reminders", 3)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	rows, _ := env.pool.Query(context.Background(), `SELECT idempotency_key || ' ' || status FROM reminders ORDER BY 1`)
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("calls made:", sent)
	fmt.Println(strings.Join(recorded, "\n"))
	// Output:
	// calls made: 1
	// fresh SENT
	// stale EXPIRED
}

// A handler that tells the rest of the system what it did: the event is written to the outbox in
// the transaction of the effect, so it is published if and only if the effect commits. A
// redelivery is a duplicate, and emits nothing again; were the same cause emitted twice, its id
// (EventID) would be the same both times, for the consumers downstream.
func ExampleEmit() {
	ctx := context.Background()
	env := setupExample()
	defer env.close()
	if err := inboxworker.Migrate(ctx, env.pool); err != nil {
		log.Fatal(err)
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE returns (order_no text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	accept := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		var event struct {
			OrderNo string `json:"order_no"`
		}
		if err := json.Unmarshal(d.Value, &event); err != nil || event.OrderNo == "" {
			return inboxworker.Permanent(inboxworker.InvalidPayload, errors.New("not a return request"))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO returns (order_no) VALUES ($1)`, event.OrderNo); err != nil {
			return err
		}
		return inboxworker.Emit(ctx, tx, inboxworker.Event{
			Topic: "return.events", AggregateType: "order", AggregateID: event.OrderNo,
			Type: "return.accepted", Cause: d.Key, Payload: []byte(`{"order_no":"` + event.OrderNo + `"}`),
		})
	})
	w, err := inboxworker.New(inboxworker.Config{
		Brokers: env.brokers,
		Pool:    env.pool,
		Routes:  []inboxworker.Route{{Topic: "returns", Name: "returns", Handler: accept}},
		// EventTopics unset: the events wait in the outbox, for the worker's relay or Debezium.
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	for range 2 { // the request, and its redelivery
		env.produce("returns", "A-1001", `{"event_id":"return-1","order_no":"A-1001"}`)
	}
	env.waitCommitted("returns", 2)
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	var events int
	var id, eventType, payload string
	if err := env.pool.QueryRow(context.Background(), `SELECT count(*) OVER (), id::text, type, payload::text FROM outbox_events`).
		Scan(&events, &id, &eventType, &payload); err != nil {
		log.Fatal(err)
	}
	fmt.Println(events, "event:", eventType, payload)
	fmt.Println("its id, derived from its cause:", id == inboxworker.EventID("return.accepted", "return-1"))
	// Output:
	// 1 event: return.accepted {"order_no":"A-1001"}
	// its id, derived from its cause: true
}
