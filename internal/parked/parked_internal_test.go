package parked

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/idkey"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

func TestParkedDeadLetter(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	p := inbox.Parked{
		Topic: "payments.callbacks", Partition: 2, Offset: 77, MessageKey: []byte("A-1"),
		Value:    []byte(`{"event_id":"evt-9"}`),
		Headers:  []inbox.Header{{Key: "Idempotency-Key", Value: []byte("evt-9")}, {Key: "dlq-reason", Value: []byte("old")}},
		Attempts: 6, Reason: "unknown_order", LastError: "no order A-1",
	}
	m := deadLetterOf(p, ".dlq", "dead-lettered by an operator", at)
	if m.Topic != "payments.callbacks.dlq" || string(m.Key) != "A-1" || string(m.Value) != string(p.Value) {
		t.Errorf("dead letter %s key %q value %q", m.Topic, m.Key, m.Value)
	}
	var got []string
	for _, h := range m.Headers {
		got = append(got, h.Key+"="+string(h.Value))
	}
	want := []string{
		"Idempotency-Key=evt-9",
		"dlq-reason=unknown_order",
		"dlq-error=dead-lettered by an operator: no order A-1",
		"dlq-original-topic=payments.callbacks",
		"dlq-original-partition=2",
		"dlq-original-offset=77",
		"dlq-attempts=6",
		"dlq-failed-at=2026-11-30T14:00:00Z",
	}
	if !slices.Equal(got, want) {
		t.Errorf("headers\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if key, _, err := idkey.Of(m); err != nil || key != "evt-9" {
		t.Errorf("the dead letter's idempotency key %q, %v; want evt-9 kept", key, err)
	}

	// A message that waited behind its key and never ran.
	p.Attempts, p.Reason, p.LastError = 0, "", ""
	m = deadLetterOf(p, ".dlq", "dead-lettered by an operator", at)
	for _, h := range m.Headers {
		switch h.Key {
		case "dlq-reason":
			if string(h.Value) != "retries_exhausted" {
				t.Errorf("dlq-reason %q, want retries_exhausted", h.Value)
			}
		case "dlq-error":
			if string(h.Value) != "dead-lettered by an operator" {
				t.Errorf("dlq-error %q", h.Value)
			}
		}
	}
}
