package deadletter_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var letter = deadletter.Letter{
	Reason:    reasonUnknownOrder,
	Error:     "order not found",
	Topic:     "payments.callbacks",
	Partition: 3,
	Offset:    42,
	Attempts:  7,
	FailedAt:  time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC),
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	original := []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("cb-1")},
		{Key: "DLQ-Reason", Value: []byte("an earlier dead-lettering's")}, // replaced, whatever its case
		{Key: "traceparent", Value: []byte("00-trace")},
	}
	headers := letter.Headers(original)
	var names []string
	for _, h := range headers {
		names = append(names, h.Key)
	}
	want := "Idempotency-Key traceparent dlq-reason dlq-error dlq-original-topic dlq-original-partition " +
		"dlq-original-offset dlq-attempts dlq-failed-at"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("header names %q, want %q", got, want)
	}
	if v := string(headers[4].Value); v != "payments.callbacks" {
		t.Errorf("dlq-original-topic = %q", v)
	}
	if v := string(headers[8].Value); v != "2025-06-01T12:00:00Z" {
		t.Errorf("dlq-failed-at = %q, want RFC 3339", v)
	}

	got, rest := deadletter.Read(headers)
	if got != letter {
		t.Errorf("Read = %+v, want %+v", got, letter)
	}
	if fmt.Sprint(rest) != fmt.Sprint([]kafka.Header{original[0], original[2]}) {
		t.Errorf("Read's original headers = %v", rest)
	}
}

// TestMessage: a dead letter goes to its topic's dead-letter topic with the original key and value,
// and reads back as the letter and the original headers.
func TestMessage(t *testing.T) {
	original := kafka.Message{Topic: "ignored", Key: []byte("order-7"), Value: []byte(`{"id":1}`),
		Headers: []kafka.Header{{Key: "traceparent", Value: []byte("00-x")}, {Key: "DLQ-Reason", Value: []byte("old")}}}
	m := letter.Message(".dlq", original)
	if m.Topic != "payments.callbacks.dlq" || string(m.Key) != "order-7" || string(m.Value) != `{"id":1}` {
		t.Errorf("dead letter to %q, key %q, value %q; want payments.callbacks.dlq, the original's", m.Topic, m.Key, m.Value)
	}
	got, headers := deadletter.Read(m.Headers)
	if !got.FailedAt.Equal(letter.FailedAt) || got.Reason != letter.Reason || got.Offset != letter.Offset {
		t.Errorf("read back %+v, want %+v", got, letter)
	}
	if len(headers) != 1 || headers[0].Key != "traceparent" {
		t.Errorf("original headers %v, want traceparent alone (an earlier dead-lettering's taken off)", headers)
	}
}

func TestReadLenient(t *testing.T) {
	t.Parallel()
	got, rest := deadletter.Read([]kafka.Header{
		{Key: "DLQ-REASON", Value: []byte("invalid_payload")},
		{Key: "dlq-original-offset", Value: []byte("not a number")},
		{Key: "dlq-unknown", Value: []byte("dropped too")},
	})
	if got != (deadletter.Letter{Reason: inboxtype.InvalidPayload}) || len(rest) != 0 {
		t.Errorf("Read = %+v, %v", got, rest)
	}
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	if got := deadletter.ErrorText(nil); got != "" {
		t.Errorf("ErrorText(nil) = %q", got)
	}
	long := strings.Repeat("é", deadletter.MaxErrorLen) // two bytes each
	got := deadletter.ErrorText(errors.New(long))
	if len(got) > deadletter.MaxErrorLen || !strings.HasPrefix(long, got) || len(got) < deadletter.MaxErrorLen-1 {
		t.Errorf("ErrorText cut %d bytes to %d", len(long), len(got))
	}
}

// TestStore checks that a stored dead letter reads back as it was written, bytes as they came and
// text Postgres cannot hold replaced, and that a replayed one is no longer pending.
func TestStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := deadletter.NewStore(pgtest.Tx(t))
	l := letter
	l.Error = "bad \x00 byte \xff"
	headers := l.Headers([]kafka.Header{{Key: "k\x00ey", Value: []byte{0, 0xff}}, {Key: "empty", Value: nil}})
	first := deadletter.Stored{DLQTopic: "payments.callbacks.dlq", Letter: l, Key: []byte{0xff, 0}, Value: []byte("v"),
		Headers: headers, WriteError: "[10] Message Size Too Large"}
	id, err := store.Save(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	other := first
	other.DLQTopic = "notifications.sms.dlq"
	if _, err := store.Save(ctx, other); err != nil {
		t.Fatal(err)
	}

	pending := func() []deadletter.Stored {
		var out []deadletter.Stored
		err := store.Pending(ctx, "payments.callbacks.dlq", func(d deadletter.Stored) (bool, error) {
			out = append(out, d)
			return true, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	got := pending()
	if len(got) != 1 {
		t.Fatalf("%d pending, want 1", len(got))
	}
	d := got[0]
	if d.ID != id || d.StoredAt.IsZero() || !bytes.Equal(d.Key, first.Key) || string(d.Value) != "v" ||
		d.WriteError != first.WriteError {
		t.Errorf("read back %+v", d)
	}
	want := l
	want.Error = "bad \uFFFD byte \uFFFD"
	d.Letter.FailedAt = d.Letter.FailedAt.UTC()
	if d.Letter != want {
		t.Errorf("letter %+v, want %+v", d.Letter, want)
	}
	if fmt.Sprint(d.Headers) != fmt.Sprint(headers) {
		t.Errorf("headers %v, want %v", d.Headers, headers)
	}

	if ok, err := store.ClaimReplay(ctx, id, "replay-1", time.Minute); !ok || err != nil {
		t.Fatalf("ClaimReplay = %v, %v", ok, err)
	}
	if err := store.MarkReplayed(ctx, id, "replay-1"); err != nil {
		t.Fatal(err)
	}
	if got := pending(); len(got) != 0 {
		t.Errorf("%d pending after replay, want none", len(got))
	}
}

// TestReplayClaims checks that one replay at a time holds a row, that a claim lapses, and that a row
// is marked replayed only by the replay holding it.
func TestReplayClaims(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tx := pgtest.Tx(t)
	store := deadletter.NewStore(tx)
	id, err := store.Save(ctx, deadletter.Stored{DLQTopic: "payments.callbacks.dlq", Letter: letter, WriteError: "too large"})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(owner string, want bool) {
		t.Helper()
		if ok, err := store.ClaimReplay(ctx, id, owner, time.Minute); ok != want || err != nil {
			t.Fatalf("ClaimReplay(%s) = %v, %v; want %v", owner, ok, err, want)
		}
	}
	claim("a", true)
	claim("b", false) // a holds it
	claim("a", true)  // a claims again, as after a retry
	if err := store.MarkReplayed(ctx, id, "b"); !errors.Is(err, deadletter.ErrReplayClaimLost) {
		t.Fatalf("MarkReplayed by b = %v, want ErrReplayClaimLost", err)
	}

	// a dies: its claim lapses, and b takes the row; a, back, cannot mark it.
	if _, err := tx.Exec(ctx, `UPDATE dead_letters SET replay_claimed_until = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	claim("b", true)
	claim("a", false)
	if err := store.MarkReplayed(ctx, id, "a"); !errors.Is(err, deadletter.ErrReplayClaimLost) {
		t.Fatalf("MarkReplayed by a after b took the row = %v, want ErrReplayClaimLost", err)
	}
	if err := store.MarkReplayed(ctx, id, "b"); err != nil {
		t.Fatal(err)
	}
	// Replayed: nobody claims it again, not even once its claim would have lapsed.
	if _, err := tx.Exec(ctx, `UPDATE dead_letters SET replay_claimed_until = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	claim("a", false)
	claim("b", false)
	if err := store.MarkReplayed(ctx, id, "b"); !errors.Is(err, deadletter.ErrReplayClaimLost) {
		t.Fatalf("MarkReplayed twice = %v, want ErrReplayClaimLost", err)
	}
}
