package payment_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/promtest"
	"github.com/inboxworker/inboxworker/internal/signature"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// provider signs callbacks as a payment provider does (Standard Webhooks), with the keys the worker
// knows (old and new HMAC secrets, an Ed25519 key pair) and others it does not.
type provider struct {
	old, new, stranger []byte
	edPublic           ed25519.PublicKey
	ed, edStranger     ed25519.PrivateKey
}

func newProvider() provider {
	edPublic, ed, _ := ed25519.GenerateKey(strings.NewReader(strings.Repeat("provider", 8)))
	_, edStranger, _ := ed25519.GenerateKey(strings.NewReader(strings.Repeat("stranger", 8)))
	return provider{old: []byte("old-secret-old-secret-old-secret"), new: []byte("new-secret-new-secret-new-secret"),
		stranger: []byte("a-secret-the-worker-never-heard-of"), edPublic: edPublic, ed: ed, edStranger: edStranger}
}

// keys is PAYMENT_SIGNING_KEYS for the worker: old and new during a rotation, and ed.
func (p provider) keys() string {
	return "old:whsec_" + base64.StdEncoding.EncodeToString(p.old) + ",new:whsec_" +
		base64.StdEncoding.EncodeToString(p.new) + ",ed:whpk_" + base64.StdEncoding.EncodeToString(p.edPublic)
}

// message is a callback for orderNo with id, signed at signedAt with signatures (webhook-signature),
// as the receiver forwards it: value as received, headers as they came, the Kafka key the order.
func message(orderNo, id string, signedAt time.Time, value []byte, signatures ...string) kafka.Message {
	return kafka.Message{Key: []byte(orderNo), Value: value, Headers: []kafka.Header{
		{Key: "webhook-id", Value: []byte(id)},
		{Key: "webhook-timestamp", Value: []byte(strconv.FormatInt(signedAt.Unix(), 10))},
		{Key: "webhook-signature", Value: []byte(strings.Join(signatures, " "))},
	}}
}

// TestSignedCallbacks runs signed callbacks through a worker whose payment route verifies them
// (Route.Verify, the Standard Webhooks verifier): those signed by a key of the worker's apply once,
// naming the key in payments.verified_by, also after waiting in the park for longer than the
// tolerance; forged, unsigned, tampered, stale, malformed and unknown-key ones are dead-lettered
// bad_signature, change no row, and are counted by problem. A transaction per message, and per batch.
func TestSignedCallbacks(t *testing.T) {
	t.Parallel()
	for name, batch := range map[string]int{"PerMessage": 1, "PerBatch": 256} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testSignedCallbacks(t, batch)
		})
	}
}

func testSignedCallbacks(t *testing.T, batchSize int) {
	const topic, dlqTopic, partitions = "payments.callbacks", "payments.callbacks.dlq", 2
	const tolerance = time.Second
	e := setup(t)
	broker := kafkatest.Start(t, partitions, topic, dlqTopic)
	for _, orderNo := range []string{"ORD-HMAC", "ORD-ED", "ORD-NEW", "ORD-FAILED", "ORD-FORGED", "ORD-UNSIGNED",
		"ORD-TAMPERED", "ORD-STALE", "ORD-MALFORMED", "ORD-STRANGER"} {
		createOrder(t, e.pool, orderNo, "99.90", "CNY", "PENDING")
	}
	p := newProvider()
	now := time.Now()
	body := func(orderNo string, changes ...string) []byte {
		fields := map[string]any{"order_no": orderNo, "provider_txn_id": "T-" + orderNo}
		for i := 0; i+1 < len(changes); i += 2 {
			fields[changes[i]] = changes[i+1]
		}
		return callback(t, fields)
	}
	signed := func(orderNo string, at time.Time, secret []byte, changes ...string) kafka.Message {
		v := body(orderNo, changes...)
		return message(orderNo, "msg_"+orderNo, at, v, signature.Sign(secret, "msg_"+orderNo, at.Unix(), v))
	}
	hmac := signed("ORD-HMAC", now, p.old)
	ed := body("ORD-ED")
	tampered := signed("ORD-TAMPERED", now, p.old)
	tampered.Value = body("ORD-TAMPERED", "amount", "99.91") // one byte
	malformed := signed("ORD-MALFORMED", now, p.old)
	malformed.Headers = malformed.Headers[:2]
	strangerValue := body("ORD-STRANGER")
	msgs := []kafka.Message{
		hmac,
		message("ORD-ED", "msg_ORD-ED", now, ed, signature.SignEd25519(p.ed, "msg_ORD-ED", now.Unix(), ed)),
		signed("ORD-NEW", now, p.new),
		signed("ORD-FAILED", now, p.old, "result", "FAILED"),
		signed("ORD-FORGED", now, p.stranger),
		{Key: []byte("ORD-UNSIGNED"), Value: body("ORD-UNSIGNED", "event_id", "e-unsigned")},
		tampered,
		signed("ORD-STALE", now.Add(-6*time.Minute), p.old), // signed 6 min before its record
		malformed,
		message("ORD-STRANGER", "msg_ORD-STRANGER", now, strangerValue,
			signature.SignEd25519(p.edStranger, "msg_ORD-STRANGER", now.Unix(), strangerValue)),
		hmac,                             // the same callback again: a duplicate
		signed("ORD-PARKED", now, p.old), // its order does not exist yet: parked
	}

	for i := range msgs {
		msgs[i].Time = now.Truncate(time.Millisecond) // the record's timestamp, which the dead letter keeps
	}

	keys, err := signature.ParseKeys(p.keys())
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := signature.NewVerifier(keys, tolerance)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	w, err := inboxworker.New(inboxworker.Config{
		Brokers:         []string{broker.Addr},
		GroupID:         "payments-test",
		Pool:            e.pool,
		Routes:          []inboxworker.Route{{Topic: topic, Name: "payments", Handler: e.handler, Verify: verifier}},
		Retry:           inboxworker.Retry{InitialInterval: 10 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxElapsed: time.Hour},
		ParkAfter:       100 * time.Millisecond,
		BatchSize:       batchSize,
		ShutdownTimeout: 5 * time.Second,
		Registerer:      reg,
		Logger:          testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	broker.Produce(t, topic, msgs...)

	committed := func() int64 {
		var n int64
		for p := range partitions {
			n += max(broker.CommittedOffset(t, "payments-test", topic, p), 0)
		}
		return n
	}
	poll.For(t, "every offset committed, the last callback parked", func() bool {
		return committed() == int64(len(msgs)) && count(t, e.pool, `SELECT count(*) FROM inbox_parked`) == 1
	})
	time.Sleep(2 * tolerance) // parked for longer than the tolerance
	createOrder(t, e.pool, "ORD-PARKED", "99.90", "CNY", "PENDING")
	poll.For(t, "the parked callback applied", func() bool {
		return count(t, e.pool, `SELECT count(*) FROM inbox_parked`) == 0
	})

	want := map[string]string{ // order → its state, and its payments with the key that verified them
		"ORD-HMAC":   "PAID; SUCCESS by old",
		"ORD-ED":     "PAID; SUCCESS by ed",
		"ORD-NEW":    "PAID; SUCCESS by new",
		"ORD-FAILED": "PENDING; FAILED by old",
		"ORD-PARKED": "PAID; SUCCESS by old",
	}
	for _, orderNo := range []string{"ORD-FORGED", "ORD-UNSIGNED", "ORD-TAMPERED", "ORD-STALE", "ORD-MALFORMED", "ORD-STRANGER"} {
		want[orderNo] = "PENDING;"
	}
	for orderNo, want := range want {
		var got string
		if err := e.pool.QueryRow(context.Background(), `
			SELECT o.status || ';' || coalesce(string_agg(' ' || p.result || ' by ' || coalesce(p.verified_by, '?'), ','), '')
			FROM orders o LEFT JOIN payments p USING (order_no) WHERE o.order_no = $1 GROUP BY o.status`,
			orderNo).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s: %q, want %q", orderNo, got, want)
		}
	}
	if n := count(t, e.pool, `SELECT count(*) FROM inbox`); n != 5 {
		t.Errorf("%d inbox rows, want 5: one per callback applied, none of those refused", n)
	}

	problems := map[string]string{} // order → dlq-error
	for part := range partitions {
		for _, m := range broker.ReadAll(t, dlqTopic, part) {
			letter, _ := deadletter.Read(m.Headers)
			if letter.Reason != inboxworker.BadSignature {
				t.Errorf("dead letter of %s: reason %s (%s), want bad_signature", m.Key, letter.Reason, letter.Error)
			}
			problems[string(m.Key)] = letter.Error
			if !letter.Produced.Equal(now.Truncate(time.Millisecond)) {
				t.Errorf("dead letter of %s: original timestamp %s, want the record's, %s", m.Key, letter.Produced, now)
			}
		}
	}
	for orderNo, words := range map[string]string{
		"ORD-FORGED": "no key matched", "ORD-UNSIGNED": "not signed", "ORD-TAMPERED": "no key matched",
		"ORD-STALE": "before the record was produced", "ORD-MALFORMED": "no header webhook-signature",
		"ORD-STRANGER": "no key matched",
	} {
		if !strings.Contains(problems[orderNo], words) {
			t.Errorf("dead letter of %s: %q, want it to say %q", orderNo, problems[orderNo], words)
		}
	}
	if len(problems) != 6 {
		t.Errorf("%d dead letters, want 6: %v", len(problems), problems)
	}
	wantFailures := map[string]float64{"unsigned": 1, "malformed": 1, "timestamp": 1, "no_key_matched": 3}
	if got := promtest.Counters(t, reg, "inboxworker_signature_failures_total", "reason"); !maps.Equal(got, wantFailures) {
		t.Errorf("signature failures %v, want %v", got, wantFailures)
	}
}

// count runs a query of one integer.
func count(t *testing.T, db querier, sql string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
