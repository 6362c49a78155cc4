package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
)

// Call is an effect whose substance is a call to another service (an SMS gateway, a payment
// provider): a network call that must not run inside a transaction, since it would hold a pooled
// connection and the key's row lock for as long as the other service takes to answer.
// Store.ProcessCall runs it in three steps, none of which holds a connection across the call:
//
//  1. lease, in a short transaction of its own: unless the key is already applied, take a lease on
//     it in inbox_leases, which keeps every other worker from calling for the key until it ends;
//  2. Run, with no transaction open and no connection held;
//  3. complete, in one transaction: the key's inbox row, the effect Run returned (the handler's
//     record of the call) and the release of the lease.
//
// The lease requests of one handler's calls share transactions when they arrive together, and so do their
// completions (see group.go): a busy worker commits many messages per transaction, and each still
// gets its own outcome. So Check and the effect may run in a group's transaction that fails for
// another message's sake, and run again, alone.
//
// The other service must accept a repeated call with the same idempotency key as one: a process that
// dies between the call and the commit leaves its lease to expire, and the next delivery takes the
// lease over and calls again with the same key.
type Call struct {
	// Lease is how long a lease on the key lasts. Run's context ends when two thirds of it have
	// passed; the last third covers a request the other service may still be working on after the
	// client gave up. It must exceed the call's own timeout with room to spare. Required.
	Lease time.Duration
	// Check, when set, runs in the lease's transaction when the key has no inbox row. It returns nil
	// to go on with the call, ErrAlreadyApplied when the handler's own records show the effect
	// happened already (the key's inbox row has expired; the inbox row is then recorded again and the
	// outcome is Duplicate), an error of Decline (no call is made; the inbox row is recorded with
	// what Check wrote, and the outcome is Decline's), or an error that ends the attempt without a
	// lease (a payload that can never be called with, say).
	Check Effect
	// Run makes the call and returns the effect that records its result, which runs in the inbox
	// transaction of step 3 and must do database work only. attempt counts the calls for the key,
	// this one included, across processes: leases that went on to call, whether their process died
	// or their call failed. Required.
	Run func(ctx context.Context, attempt int) (Effect, error)
}

// ErrNotCalled, wrapped in an error of Call.Run, says that Run made no call: it gave up before the
// call went out (waiting for its turn, say). The lease is released at once, whatever ended Run, so
// that the key's next caller need not wait for it to expire.
var ErrNotCalled = errors.New("inbox: no call was made")

// ErrLeaseHeld is the cause of the error ProcessCall returns when another caller holds a live lease
// on the key: a call for it may be in flight. That error is retryable (package fault), no sooner
// than the lease ends.
var ErrLeaseHeld = errors.New("inbox: another caller holds the lease on the key")

// ErrCalledUnrecorded is the cause of the error ProcessCall returns for a key whose call was made
// once and whose completion then failed for good (see Call): it makes no call, and its error is
// permanent (handler_error), until the key's row of inbox_leases is deleted, which says to call
// again.
var ErrCalledUnrecorded = errors.New("inbox: the key was called before, and its call was never recorded; not calling it again")

// ProcessCall runs call for msg in the three steps Call describes. It returns Applied when the call's
// effect committed with the key, Duplicate or KeyReused when the key was already recorded (no call
// was made), Expired or Suppressed when Check declined the message (no call was made), or an
// error, in which case nothing was recorded and the lease is released — unless the call was
// abandoned when its context ended (and Run did not say ErrNotCalled), or Postgres cannot be
// reached: then the lease is left to expire; or the effect failed for good after the call was made:
// then the lease stays, marked called, and the key's next caller gets ErrCalledUnrecorded and makes
// no call until the row is deleted. A live lease held by another caller is a retryable
// error wrapping ErrLeaseHeld whose RetryAfter is the lease's remaining time.
//
// A call error is returned as it is; a Postgres error is classified (see Classify).
func (s *Store) ProcessCall(ctx context.Context, msg Message, call Call) (Outcome, error) {
	switch {
	case msg.Handler == "" || msg.Key == "":
		return "", fmt.Errorf("inbox: message needs a handler and a key, got %q and %q", msg.Handler, msg.Key)
	case call.Lease <= 0 || call.Run == nil:
		return "", errors.New("inbox: Call.Lease and Call.Run are required")
	}
	// Taken before the lease, so that the deadline on this clock falls before the lease's end on
	// Postgres's clock, whatever their offset.
	deadline := time.Now().Add(call.Lease * 2 / 3)
	l := &lease{msg: msg, holder: NewHolder("call of " + msg.Handler)}
	outcome, err := s.takeLease(ctx, l, call)
	if err != nil || outcome != "" {
		return outcome, err
	}
	if ctx.Err() != nil {
		// Ended while the lease's group committed: no call was made, and the next caller need not
		// wait for the lease to expire.
		s.release(ctx, l, false)
		return "", Classify(fmt.Errorf("inbox: %w", context.Cause(ctx)))
	}

	callCtx, cancel := context.WithDeadline(ctx, deadline)
	effect, err := call.Run(callCtx, l.attempts)
	abandoned := (callCtx.Err() != nil || timedOut(err)) && !errors.Is(err, ErrNotCalled)
	cancel()
	if err != nil {
		// A call that ended on its own (an answer that says no, a refused connection) is over: the
		// next caller may call at once. One that was abandoned — its context ended (the lease's
		// deadline, a rebalance, a shutdown), or the client gave up waiting for the answer (its own
		// timeout, the most common abandonment) — may still be worked on by the other service: its
		// lease stays until it expires, so that no other call of the key overlaps it.
		if !abandoned {
			s.release(ctx, l, isPermanent(err))
		}
		return "", err
	}

	return s.record(ctx, l, effect)
}

// record completes the call made under l: the key's inbox row and effect in one transaction. A
// record that fails for good keeps the lease, marked called; any other failure releases it.
func (s *Store) record(ctx context.Context, l *lease, effect Effect) (Outcome, error) {
	msg := l.msg
	outcome, lost, err := s.complete(ctx, msg, l.holder, effect)
	switch {
	case err != nil && isPermanent(err) && ctx.Err() == nil && !errors.Is(err, context.Canceled):
		// The call was made, and its record failed for good: the lease stays, marked called, so
		// that a replay does not call again unasked, and the error says what happened. (A record
		// cut short by a rebalance or a stop is no failure of its own: the next delivery calls
		// again, under the same key.)
		s.releaseCalled(ctx, l)
		err = fmt.Errorf("the call was made, and recording it failed (inbox_leases keeps its key as called): %w", err)
	case err != nil:
		// Nothing committed: the retry, if any, calls again, with the same key.
		s.release(ctx, l, isPermanent(err))
	case lost:
		s.config.Logger.WarnContext(ctx, "the lease on the key was taken over while the call ran",
			slog.String("handler", msg.Handler), slog.String("key", msg.Key))
	}
	return outcome, err
}

// timedOut reports whether a call's error is a timeout: the client stopped waiting for an answer,
// which the other service may still be preparing.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout()
}

// lease is one lease taken on a key, by one caller.
type lease struct {
	msg      Message
	holder   string
	attempts int // the key's calls, this one's included
}

// NewHolder names a holder of something the instances of a group share, in the one format of
// every holder the worker writes (a call's lease on a key, a retrier's holds on parked messages,
// the outbox relay's lease, an order being reconciled, a replay's claims on stored dead letters):
// what holds it, role, then where, for an operator reading the table, and a random part that tells
// two holders of one process apart: "outbox relay on host-1, pid 4242, 9f3c61d0a2b4e857".
func NewHolder(role string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return role + " on " + process() + ", " + hex.EncodeToString(b)
}

// process is where this process runs, as a holder names it: its host and pid.
var process = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s, pid %d", host, os.Getpid())
})

// takeLeaseSQL takes the key's lease unless a live one is held: a new row, or an expired row taken
// over. It returns nothing when another caller's lease is live. now() is the lease transaction's
// start, which errs on the side of a lease being live.
const takeLeaseSQL = `
INSERT INTO inbox_leases (handler, idempotency_key, holder, expires_at, attempts)
VALUES ($1, $2, $3, now() + $4 * interval '1 microsecond', 1)
ON CONFLICT (handler, idempotency_key) DO UPDATE
SET holder = excluded.holder, expires_at = excluded.expires_at, attempts = inbox_leases.attempts + 1,
    taken_at = now()
WHERE inbox_leases.expires_at <= now() AND inbox_leases.called_at IS NULL
RETURNING attempts`

// A lease is released in one of two ways. Expired at once, it keeps its count of attempts for the
// next caller, which calls again. Forgotten, it is deleted: once the key is recorded, or its message
// fails for good.
const (
	expireLeaseSQL = `UPDATE inbox_leases SET expires_at = now()
WHERE handler = $1 AND idempotency_key = $2 AND holder = $3`
	// calledLeaseSQL keeps the lease of a call whose completion failed for good, expired and marked
	// called: the key is not called again until the row is deleted (see ErrCalledUnrecorded).
	calledLeaseSQL = `UPDATE inbox_leases SET expires_at = now(), called_at = now()
WHERE handler = $1 AND idempotency_key = $2 AND holder = $3`
	forgetLeaseSQL = `DELETE FROM inbox_leases WHERE handler = $1 AND idempotency_key = $2 AND holder = $3`
)

// lease is step 1 of ProcessCall for one message alone, as a request does when the group it was in
// failed (see takeLease and commitLeases, which do the same for several): in one transaction, it
// takes l's lease, then looks for the key's inbox row, then runs call.Check. It returns Duplicate or
// KeyReused (and keeps no lease) when the key is applied, Duplicate, Expired or Suppressed (and
// keeps no lease, the key recorded) when Check reports it applied or declines it, "" when the
// lease is held.
//
// The lease is taken before the inbox row is looked for: a caller that waited for another's
// completion (which deletes the lease row and writes the inbox row in one transaction) then reads
// that inbox row in its next statement, and calls nobody.
//
// The lease's commit does not wait for the WAL to reach the disk (synchronous_commit off): a lease
// lost in a crash of Postgres itself only lets another worker call for the key while the first call
// may still be in flight, which the other service's idempotency absorbs; the complete step, which
// records the effect, commits synchronously. This spares one flush per message.
func (s *Store) lease(ctx context.Context, l *lease, call Call) (Outcome, error) {
	msg := l.msg
	var outcome Outcome
	err := WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		taken, stored, found, err := takeLeaseAndLook(ctx, tx, l, call.Lease)
		if err != nil {
			return err
		}
		switch {
		case found && string(stored) == string(msg.Fingerprint[:]):
			outcome = Duplicate
			return errRollback // the lease, if taken, goes with the rollback
		case found:
			outcome = KeyReused
			return errRollback
		case !taken:
			return s.leaseHeld(ctx, tx, msg)
		}
		outcome, err = s.runCheck(ctx, tx, l, call)
		return err
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return outcome, err
}

// takeLeaseAndLook sends lease's first statements in one round trip: it takes l's lease for d
// unless another caller's is live (taken says whether it did, and l.attempts gets the key's count
// of attempts), and reads the fingerprint of the key's inbox row (found says whether there is one).
func takeLeaseAndLook(ctx context.Context, tx pgx.Tx, l *lease, d time.Duration) (taken bool, stored []byte, found bool, err error) {
	msg := l.msg
	b := &pgx.Batch{}
	b.Queue(`SELECT set_config('synchronous_commit', $1, true)`, leaseSynchronousCommit)
	b.Queue(takeLeaseSQL, msg.Handler, msg.Key, l.holder, d.Microseconds())
	b.Queue(`SELECT fingerprint FROM inbox WHERE handler = $1 AND idempotency_key = $2`, msg.Handler, msg.Key)
	results := tx.SendBatch(ctx, b)
	_, err = results.Exec()
	if err == nil {
		err = results.QueryRow().Scan(&l.attempts)
	}
	taken = err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err == nil {
		err = results.QueryRow().Scan(&stored)
	}
	found = err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil
	}
	if err := errors.Join(err, results.Close()); err != nil {
		return false, nil, false, Classify(fmt.Errorf("inbox: take the lease: %w", err))
	}
	return taken, stored, found, nil
}

// runCheck runs call.Check, if any, in the lease's transaction, once l's lease is taken and the key
// found not applied. It returns "" to go on with the call; when Check reports the key applied or
// declines it, it deletes the lease, records the key, and returns the outcome.
func (s *Store) runCheck(ctx context.Context, tx pgx.Tx, l *lease, call Call) (Outcome, error) {
	if call.Check == nil {
		return "", nil
	}
	err := call.Check(ctx, tx)
	if err == nil {
		return "", nil
	}
	recorded, ok := recordedBy(err)
	if !ok {
		return "", classifyEffectError(ctx, tx, err)
	}
	// Applied under this key before its inbox row expired, or declined: record the key, with
	// what Check wrote, and make no call.
	msg := l.msg
	if _, err := tx.Exec(ctx, forgetLeaseSQL, msg.Handler, msg.Key, l.holder); err != nil {
		return "", Classify(fmt.Errorf("inbox: release the lease: %w", err))
	}
	outcome, err := s.claim(ctx, tx, msg)
	if err == nil && outcome == Applied {
		outcome = recorded
	}
	return outcome, err
}

// leaseSynchronousCommit is the lease transaction's synchronous_commit: "off" (see lease). The
// benchmark of the lease compares it with "on".
var leaseSynchronousCommit = "off"

// errRollback ends a lease transaction that found the key applied: nothing it did is kept.
var errRollback = errors.New("inbox: roll back")

// leaseHeld returns the retryable error of a caller that found msg's lease live, or the permanent
// one of a key called before whose call was never recorded (ErrCalledUnrecorded).
func (s *Store) leaseHeld(ctx context.Context, tx pgx.Tx, msg Message) error {
	var seconds float64
	var holder string
	var calledAt *time.Time
	err := tx.QueryRow(ctx, `
		SELECT holder, greatest(extract(epoch FROM expires_at - clock_timestamp()), 0)::float8, called_at
		FROM inbox_leases WHERE handler = $1 AND idempotency_key = $2`,
		msg.Handler, msg.Key).Scan(&holder, &seconds, &calledAt)
	remaining := time.Duration(seconds * float64(time.Second))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Released since: its holder has just completed or given up. Retry at once.
	case err != nil:
		return Classify(fmt.Errorf("inbox: read the lease: %w", err))
	case calledAt != nil:
		return fault.Permanent(inboxtype.HandlerError, fmt.Errorf(
			"%w: called by %s, whose record failed at %s; to call it again, delete the key's row of inbox_leases and replay",
			ErrCalledUnrecorded, holder, calledAt.UTC().Format(time.RFC3339)))
	}
	return &fault.Error{Kind: fault.KindRetryable, RetryAfter: remaining,
		Err: fmt.Errorf("%w (%s, for %s more)", ErrLeaseHeld, holder, remaining.Round(time.Millisecond))}
}

// releaseCalled ends l's lease after a call whose completion failed for good, keeping it marked
// called (calledLeaseSQL).
func (s *Store) releaseCalled(ctx context.Context, l *lease) { s.endLease(ctx, l, calledLeaseSQL) }

// isPermanent reports whether err is classified permanent.
func isPermanent(err error) bool {
	kind, _, _ := fault.Classify(err)
	return kind == fault.KindPermanent
}

// release ends l's lease after a call that failed or whose completion did not commit: the call is
// over, so the next caller need not wait for the lease to expire. forget deletes the lease (the
// message has failed for good, or the key is recorded); otherwise it expires at once and keeps its
// count of attempts. It runs even when ctx is cancelled. A failed release is logged; the lease then
// expires in its time.
func (s *Store) release(ctx context.Context, l *lease, forget bool) {
	sql := expireLeaseSQL
	if forget {
		sql = forgetLeaseSQL
	}
	s.endLease(ctx, l, sql)
}

// endLease runs sql, one of the statements that end a lease, on l's, even when ctx is cancelled.
func (s *Store) endLease(ctx context.Context, l *lease, sql string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := s.pool.Exec(rctx, sql, l.msg.Handler, l.msg.Key, l.holder); err != nil {
		s.config.Logger.WarnContext(ctx, "cannot release the lease on the key; it will expire",
			slog.String("handler", l.msg.Handler), slog.String("key", l.msg.Key), slog.Any("error", err))
	}
}
