package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// declineByKey declines the deliveries whose key starts with "late" (expired) or "over"
// (suppressed), having recorded "declined <key>" in effects, as a handler records its decision.
func declineByKey(ctx context.Context, tx pgx.Tx, d inbox.Delivery) (bool, error) {
	var outcome inbox.Outcome
	switch {
	case strings.HasPrefix(d.Key, "late"):
		outcome = inbox.Expired
	case strings.HasPrefix(d.Key, "over"):
		outcome = inbox.Suppressed
	default:
		return false, nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (key, body) VALUES ($1, 'declined')`, d.Key); err != nil {
		return true, err
	}
	return true, inbox.Decline(outcome, errors.New("not now"))
}

// decliner is a BatchHandler that declines as declineByKey says and applies the rest.
type decliner struct{ recorder }

func (h *decliner) Handle(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	if declined, err := declineByKey(ctx, tx, d); declined {
		return err
	}
	return h.recorder.Handle(ctx, tx, d)
}

func (h *decliner) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	errs := make([]error, len(ds))
	for i, d := range ds {
		declined, err := declineByKey(ctx, tx, d)
		if !declined {
			err = h.recorder.Handle(ctx, tx, d)
		}
		// A batch goes on past a decline: it is a result, not a failure.
		if errs[i] = err; err != nil && !declined {
			break
		}
	}
	return errs
}

// TestDeclined: messages their handler declines on purpose finish as expired or suppressed, their
// keys and the handler's record of the decision committed, their offsets committed, none of them
// retried or dead-lettered; redelivered, they are duplicates.
func TestDeclined(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 2)
		config := e.config(&decliner{})
		e.start(config)
		msgs := e.produce("a", "late-1", "b", "over-1", "late-2", "c")
		e.waitFor("every message finished", func() bool { return e.committed() == int64(len(msgs)) })
		e.waitFor("every message counted", func() bool {
			return outcomes(config, "applied")+outcomes(config, "expired")+outcomes(config, "suppressed") == float64(len(msgs))
		})
		for outcome, want := range map[string]float64{"applied": 3, "expired": 2, "suppressed": 1, "dead_lettered": 0, "duplicate": 0} {
			if got := outcomes(config, outcome); got != want {
				t.Errorf("%s: %v, want %v", outcome, got, want)
			}
		}
		checkOnce(t, e, []string{"a", "b", "c", "late-1", "late-2", "over-1"})
		if keys := e.inboxKeys(); len(keys) != len(msgs) {
			t.Errorf("inbox keys %v, want all %d", keys, len(msgs))
		}
		if n := testutilRetries(config); n != 0 {
			t.Errorf("%v retries, want none", n)
		}

		e.kafka.Produce(t, topic, msgs[1], msgs[3]) // redelivered
		e.waitFor("the redeliveries finished", func() bool { return e.committed() == int64(len(msgs)+2) })
		e.waitFor("the redeliveries counted", func() bool { return outcomes(config, "duplicate") == 2 })
		checkOnce(t, e, []string{"a", "b", "c", "late-1", "late-2", "over-1"})
		if dead := e.deadLetters(); len(dead) != 0 {
			t.Errorf("%d dead letters, want none", len(dead))
		}
	})
}

// parkedDecliner is a caller whose Check declines, as declineByKey says, a message that is parked:
// the first attempt of a parked retry. It fails the test if a message it declined is called.
type parkedDecliner struct {
	*caller
	t        *testing.T
	declined sync.Map // keys declined
}

func (h *parkedDecliner) Check(ctx context.Context, tx pgx.Tx, d inbox.Delivery) error {
	var parked bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM inbox_parked WHERE idempotency_key = $1)`, d.Key).Scan(&parked); err != nil {
		return err
	}
	if parked {
		if declined, err := declineByKey(ctx, tx, d); declined {
			h.declined.Store(d.Key, true)
			return err
		}
	}
	return h.caller.Check(ctx, tx, d)
}

func (h *parkedDecliner) Call(ctx context.Context, d inbox.Delivery) (inbox.Effect, error) {
	if _, ok := h.declined.Load(d.Key); ok {
		h.t.Errorf("%s called after its Check declined it", d.Key)
	}
	return h.caller.Call(ctx, d)
}

// TestCallDeclinedWhenParked: a call that keeps failing is parked; its Check, run right before
// the parked retry's call, declines it: no call is made, the message leaves the park with its key
// and the Check's record committed, finishes as expired, and the key's next message follows.
func TestCallDeclinedWhenParked(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	h := &parkedDecliner{t: t, caller: newCaller(func(ctx context.Context, d inbox.Delivery) error {
		if d.Key == "late-1" {
			return fault.Retryable(errors.New("provider down"))
		}
		return nil
	})}
	config := e.callConfig(h)
	parkSoon(&config)
	config.Retry.MaxElapsed = 10 * time.Minute
	e.produceOrdered("phone-1", "late-1", "next-1")
	e.start(config)
	e.waitFor("both counted", func() bool { return outcomes(config, "expired")+outcomes(config, "applied") == 2 })
	if _, ok := h.declined.Load("late-1"); !ok || h.callsOf("late-1") == 0 {
		t.Fatalf("late-1 declined %v after %d calls; want declined once parked, after its failed calls",
			ok, h.callsOf("late-1"))
	}
	// Left behind in the park, it would be taken again once its hold lapsed, found recorded and
	// counted a duplicate too.
	if exp, app, dup := outcomes(config, "expired"), outcomes(config, "applied"), outcomes(config, "duplicate"); exp != 1 || app != 1 || dup != 0 {
		t.Errorf("expired %v, applied %v, duplicate %v; want 1, 1 and 0", exp, app, dup)
	}
	if parked := e.parkedKeys(); len(parked) != 0 {
		t.Errorf("still parked: %v", parked)
	}
	checkOnce(t, e, []string{"late-1", "next-1"})
	if keys := e.inboxKeys(); keys["late-1"] != 1 || keys["next-1"] != 1 {
		t.Errorf("inbox keys %v, want late-1 and next-1", keys)
	}
	if leases := e.leases(); len(leases) != 0 {
		t.Errorf("leases left: %v", leases)
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}
