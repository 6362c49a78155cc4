package inboxworker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker"
)

// parcels is a BatchHandler: it records the scans of a batch in one statement, and one at a time
// (Handle) when the worker takes a message out of a batch that failed.
type parcels struct{}

func (p parcels) Handle(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	return p.HandleBatch(ctx, tx, []inboxworker.Delivery{d})[0]
}

func (parcels) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inboxworker.Delivery) []error {
	results := make([]error, len(ds))
	keys, names := make([]string, len(ds)), make([]string, len(ds))
	for i, d := range ds {
		var scan struct {
			Parcel string `json:"parcel"`
		}
		if err := json.Unmarshal(d.Value, &scan); err != nil || scan.Parcel == "" {
			// The batch rolls back; the worker applies the scans before this one again, and
			// dead-letters this one through Handle.
			results[i] = inboxworker.Permanent(inboxworker.InvalidPayload, errors.New("not a parcel scan"))
			return results
		}
		keys[i], names[i] = d.Key, scan.Parcel
	}
	_, err := tx.Exec(ctx, `INSERT INTO scans (scan_id, parcel) SELECT * FROM unnest($1::text[], $2::text[])`, keys, names)
	results[0] = err // nil, or an error of the statement, the whole batch's
	return results
}

// A BatchHandler applies many messages in one transaction, with set-based statements: one commit
// for a batch, each message's effect still applied once.
func ExampleBatchHandler() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE scans (scan_id text PRIMARY KEY, parcel text NOT NULL)`)

	env.produce("parcels", "P-1", `{"event_id":"scan-1","parcel":"P-1"}`)
	env.produce("parcels", "P-2", `{"event_id":"scan-2","parcel":"P-2"}`)
	env.produce("parcels", "P-3", `{"event_id":"scan-3"}`)
	env.produce("parcels", "P-1", `{"event_id":"scan-1","parcel":"P-1"}`) // delivered again
	env.run(inboxworker.Config{Routes: []inboxworker.Route{{Topic: "parcels", Name: "parcels", Handler: parcels{}}}}, 4)

	fmt.Println(strings.Join(env.rows(`SELECT scan_id || ' ' || parcel FROM scans ORDER BY 1`), "\n"))
	fmt.Println(env.deadLetters("parcels.dlq", 1)[0])
	// Output:
	// scan-1 P-1
	// scan-2 P-2
	// P-3 invalid_payload: not a parcel scan
}

// A handler dead-letters what it can never apply, with a reason of its own domain: the invoice in
// a currency the ledger does not keep goes to invoices.dlq, and the next invoice goes on.
func ExamplePermanent() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE invoices (invoice_no text PRIMARY KEY, cents bigint NOT NULL)`)
	book := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		var invoice struct {
			No       string `json:"invoice_no"`
			Cents    int64  `json:"cents"`
			Currency string `json:"currency"`
		}
		if err := json.Unmarshal(d.Value, &invoice); err != nil {
			return inboxworker.Permanent(inboxworker.InvalidPayload, err)
		}
		if invoice.Currency != "EUR" {
			return inboxworker.Permanent("unsupported_currency", fmt.Errorf("currency %q: the ledger keeps EUR", invoice.Currency))
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (invoice_no, cents) VALUES ($1, $2)`, invoice.No, invoice.Cents)
		return err
	})

	env.produce("invoices", "I-1", `{"event_id":"i-1","invoice_no":"I-1","cents":1200,"currency":"USD"}`)
	env.produce("invoices", "I-2", `{"event_id":"i-2","invoice_no":"I-2","cents":900,"currency":"EUR"}`)
	env.run(inboxworker.Config{Routes: []inboxworker.Route{{Topic: "invoices", Name: "invoices", Handler: book}}}, 2)

	fmt.Println("booked:", env.rows(`SELECT invoice_no FROM invoices`))
	fmt.Println(env.deadLetters("invoices.dlq", 1)[0])
	// Output:
	// booked: [I-2]
	// I-1 unsupported_currency: currency "USD": the ledger keeps EUR
}

// A failure worth another try is retried with backoff, the message's later ones of its key
// waiting: here a lookup that fails twice, then answers.
func ExampleRetryable() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE refunds (refund_id text PRIMARY KEY, attempt int NOT NULL)`)
	refund := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		if d.Attempt < 3 { // the lookup's failures, in this example
			return inboxworker.Retryable(errors.New("the ledger is closing the day"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO refunds (refund_id, attempt) VALUES ($1, $2)`, d.Key, d.Attempt)
		return err
	})

	env.produce("refunds", "A-1", `{"event_id":"refund-1"}`)
	env.run(inboxworker.Config{
		Routes: []inboxworker.Route{{Topic: "refunds", Name: "refunds", Handler: refund}},
		Retry:  inboxworker.Retry{InitialInterval: 10 * time.Millisecond},
	}, 1)

	fmt.Println(env.rows(`SELECT refund_id || ' applied at attempt ' || attempt FROM refunds`)[0])
	// Output: refund-1 applied at attempt 3
}

// A failure that may yet go away is retried until the budget runs out, then dead-lettered with
// the reason that says what was missing: a refund for an order that does not exist (yet).
func ExampleRetryableUntil() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE customer_orders (order_no text PRIMARY KEY, refunded bool NOT NULL DEFAULT false)`)
	refund := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		var event struct {
			OrderNo string `json:"order_no"`
		}
		if err := json.Unmarshal(d.Value, &event); err != nil {
			return inboxworker.Permanent(inboxworker.InvalidPayload, err)
		}
		tag, err := tx.Exec(ctx, `UPDATE customer_orders SET refunded = true WHERE order_no = $1`, event.OrderNo)
		if err == nil && tag.RowsAffected() == 0 {
			return inboxworker.RetryableUntil("unknown_order", fmt.Errorf("no order %s", event.OrderNo))
		}
		return err
	})

	env.produce("refunds", "A-404", `{"event_id":"refund-9","order_no":"A-404"}`)
	env.run(inboxworker.Config{
		Routes: []inboxworker.Route{{Topic: "refunds", Name: "refunds", Handler: refund}},
		Retry:  inboxworker.Retry{InitialInterval: 10 * time.Millisecond, MaxElapsed: 200 * time.Millisecond},
	}, 1)

	fmt.Println(env.deadLetters("refunds.dlq", 1)[0])
	// Output: A-404 unknown_order: no order A-404
}

// quoter is a CallHandler whose service limits its callers: a 429 carries the wait it asks for.
type quoter struct{ url string }

func (quoter) Check(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error { return nil }

func (q quoter) Call(ctx context.Context, d inboxworker.Delivery) (inboxworker.Completion, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.url, strings.NewReader(string(d.Value)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", d.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, inboxworker.Retryable(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		wait, _ := time.ParseDuration(resp.Header.Get("Retry-After") + "s")
		return nil, inboxworker.RetryableAfter(errors.New("the quote service is busy"), wait)
	}
	return nil, nil // nothing to record but the key
}

// A call the other service asks to try again later is retried no sooner than it asked, the whole
// route waiting with it, and the wait not charged to the message's retry budget.
func ExampleRetryableAfter() {
	env := setupExample()
	defer env.close()
	env.migrate(`SELECT 1`)
	var mu sync.Mutex
	var calls []time.Time
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, time.Now())
		if len(calls) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer service.Close()

	env.produce("quotes", "C-1", `{"event_id":"quote-1"}`)
	env.run(inboxworker.Config{Routes: []inboxworker.Route{{Topic: "quotes", Name: "quotes", Call: quoter{url: service.URL}}}}, 1)

	mu.Lock()
	defer mu.Unlock()
	fmt.Println("calls:", len(calls))
	fmt.Println("the second a second or more after the first:", calls[1].Sub(calls[0]) >= time.Second)
	// Output:
	// calls: 2
	// the second a second or more after the first: true
}

// texter is a CallHandler that sends a recipient one text at most: its Check suppresses the rest,
// recording that it did, so that a redelivery stays a no-op.
type texter struct{ sent *int }

func (texter) Check(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
	var text struct {
		To string `json:"to"`
	}
	if err := json.Unmarshal(d.Value, &text); err != nil {
		return inboxworker.Permanent(inboxworker.InvalidPayload, err)
	}
	var earlier bool
	err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM texts WHERE recipient = $1 AND status = 'SENT')`, text.To).Scan(&earlier)
	if err != nil || !earlier {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO texts VALUES ($1, $2, 'SUPPRESSED')`, d.Key, text.To); err != nil {
		return err
	}
	return inboxworker.Suppressed(fmt.Errorf("%s had a text already", text.To))
}

func (t texter) Call(ctx context.Context, d inboxworker.Delivery) (inboxworker.Completion, error) {
	*t.sent++ // the call to the SMS gateway
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO texts VALUES ($1, $2::jsonb->>'to', 'SENT')`, d.Key, d.Value)
		return err
	}, nil
}

// A call route that declines a message over a limit on purpose: the second text to one recipient
// is recorded as suppressed, and not sent.
func ExampleSuppressed() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE texts (idempotency_key text PRIMARY KEY, recipient text NOT NULL, status text NOT NULL)`)

	env.produce("texts", "u-1", `{"event_id":"t-1","to":"u-1"}`)
	env.produce("texts", "u-1", `{"event_id":"t-2","to":"u-1"}`)
	env.produce("texts", "u-1", `{"event_id":"t-2","to":"u-1"}`) // delivered again
	var sent int
	env.run(inboxworker.Config{Routes: []inboxworker.Route{{Topic: "texts", Name: "texts", Call: texter{sent: &sent}}}}, 3)

	fmt.Println("texts sent:", sent)
	fmt.Println(strings.Join(env.rows(`SELECT idempotency_key || ' ' || status FROM texts ORDER BY 1`), "\n"))
	// Output:
	// texts sent: 1
	// t-1 SENT
	// t-2 SUPPRESSED
}

// A handler reports what it did once its transaction commits, never for a transaction rolled back
// (a batch run again, a retry): one line per shipment, however often its event arrives.
func ExampleAfterCommit() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE shipments (order_no text PRIMARY KEY)`)
	var mu sync.Mutex
	var lines []string
	ship := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		if _, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1::jsonb->>'order_no')`, d.Value); err != nil {
			return err
		}
		inboxworker.AfterCommit(ctx, func(context.Context) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, "shipped, event "+d.Key)
		})
		return nil
	})

	for range 3 {
		env.produce("shipments", "A-1", `{"event_id":"ship-1","order_no":"A-1"}`)
	}
	env.run(inboxworker.Config{Routes: []inboxworker.Route{{Topic: "shipments", Name: "shipments", Handler: ship}}}, 3)

	mu.Lock()
	defer mu.Unlock()
	fmt.Println(strings.Join(lines, "\n"))
	// Output: shipped, event ship-1
}

// A topic whose producers put the idempotency key in a header of their own names it in Route.Key,
// and falls back on the contract's rule for the rest.
func ExampleRoute_key() {
	env := setupExample()
	defer env.close()
	env.migrate(`CREATE TABLE shipments (idempotency_key text PRIMARY KEY)`)
	requestID := func(m inboxworker.Received) (string, error) {
		for _, h := range m.Headers {
			if strings.EqualFold(h.Key, "X-Request-Id") && len(h.Value) > 0 {
				return string(h.Value), nil
			}
		}
		return inboxworker.DefaultKey(m)
	}
	record := inboxworker.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d inboxworker.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments VALUES ($1)`, d.Key)
		return err
	})

	env.produceWith("shipments", `{"order_no":"A-1"}`, "X-Request-Id", "req-7")
	env.produceWith("shipments", `{"order_no":"A-1"}`, "X-Request-Id", "req-7") // a client's retry
	env.produce("shipments", "A-2", `{"event_id":"ship-2","order_no":"A-2"}`)
	env.produce("shipments", "A-3", `{"order_no":"A-3"}`)
	env.run(inboxworker.Config{Routes: []inboxworker.Route{
		{Topic: "shipments", Name: "shipments", Handler: record, Key: requestID}}}, 4)

	fmt.Println(env.rows(`SELECT idempotency_key FROM shipments ORDER BY 1`))
	fmt.Println(env.deadLetters("shipments.dlq", 1)[0])
	// Output:
	// [req-7 ship-2]
	// A-3 missing_idempotency_key: no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, no JSON field event_id
}

// The contract's rule: a header first, else the JSON member event_id; a message with neither has
// no key, and its error carries the reason its dead letter gets.
func ExampleDefaultKey() {
	for _, m := range []inboxworker.Received{
		{Value: []byte(`{"event_id":"evt-1"}`), Headers: []inboxworker.Header{{Key: "idempotency-key", Value: []byte("abc")}}},
		{Value: []byte(`{"event_id":"evt-1"}`)},
		{Value: []byte(`{"order_no":"A-1"}`)},
		{Value: []byte(`not JSON`)},
	} {
		if key, err := inboxworker.DefaultKey(m); err != nil {
			fmt.Println("none:", err)
		} else {
			fmt.Println("key:", key)
		}
	}
	// Output:
	// key: abc
	// key: evt-1
	// none: no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, no JSON field event_id
	// none: not valid JSON (and no header Idempotency-Key, X-Idempotent-Key or webhook-id to take the idempotency key from)
}
