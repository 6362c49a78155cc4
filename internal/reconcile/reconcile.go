// Package reconcile finds the payments whose callbacks never came. It asks the payment provider
// about each order still PENDING RECONCILE_AFTER after its creation, then again at doubling
// intervals capped at an hour, until RECONCILE_MAX_AGE; an answer that the order was paid or that
// its payment failed is applied exactly as the callback with its fields would be (package payment's
// Handler.Reconciled): the same state machine, the same business key, so that the callback itself,
// before, during or after the answer, is applied once in all.
//
// The instances of a group share the work through the table payment_reconciliations: an instance
// holds an order while it asks about it (no order is asked about twice at once), and books each
// request's turn in the group's shared rate schedule (inbox.Store.BookCalls), so that the group asks
// no more than its rate limit a second, however many instances run. No transaction is open while a
// request is out. Failed requests are the concern of a route's outage circuit
// (gate.DependencyCircuit): failures from several orders pause the asking, one probe at a time
// at a doubling interval up to a minute; an order the endpoint alone fails on pauses nobody, and is
// asked about again a minute later at most. An order past
// RECONCILE_MAX_AGE is left PENDING and counted; the worker never cancels an order.
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/gate"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/wait"
)

// maxInterval caps the doubling interval between two questions about one order.
const maxInterval = time.Hour

// holdFor is how long an instance holds an order it asks about: its turn under the rate limit,
// the request and the record of the answer fit in it many times over. An instance that dies
// holding one leaves it to the others once it runs out.
const holdFor = 2 * time.Minute

// Config configures a Reconciler.
type Config struct {
	// Pool holds orders, payments and payment_reconciliations. Required.
	Pool *pgxpool.Pool
	// Payments applies the answers. Required.
	Payments *payment.Handler
	// Store books the requests' turns in the group's shared rate schedule. Required.
	Store *inbox.Store
	// Group is the consumer group whose instances share the rate limit. Required.
	Group string
	// Status asks the provider. Required.
	Status *Status
	// RateLimit is the most requests a second for the whole group. Required.
	RateLimit float64
	// After and MaxAge are RECONCILE_AFTER and RECONCILE_MAX_AGE. Required.
	After, MaxAge time.Duration
	// Metrics, when set, counts the answers.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Reconciler asks the provider about the orders left PENDING, until its context ends.
type Reconciler struct {
	cfg    Config
	holder string
	// circuit pauses the asking while the status endpoint looks down: a route's outage circuit.
	circuit *gate.DependencyCircuit
	log     *slog.Logger
	// idle is how long a worker waits when no order is due.
	idle time.Duration
}

// New returns a Reconciler of cfg.
func New(cfg Config) (*Reconciler, error) {
	switch {
	case cfg.Pool == nil || cfg.Payments == nil || cfg.Store == nil || cfg.Status == nil || cfg.Group == "":
		return nil, errors.New("reconcile: Config needs Pool, Payments, Store, Status and Group")
	case cfg.RateLimit <= 0 || cfg.After <= 0 || cfg.MaxAge <= cfg.After:
		return nil, fmt.Errorf("reconcile: want a positive rate limit and 0 < After < MaxAge, got %v, %s, %s",
			cfg.RateLimit, cfg.After, cfg.MaxAge)
	}
	log := cmp.Or(cfg.Logger, slog.Default()).With("component", "reconciliation")
	circuit, err := gate.NewDependencyCircuit(gate.CircuitConfig{MaxProbeInterval: maxProbeInterval,
		OnChange: func(from, to gate.RouteState, _, why string) {
			switch {
			case from == gate.RouteOpen:
				log.Warn("pausing reconciliation: the payment status endpoint looks down", "why", why)
			case to == gate.RouteOpen:
				log.Info("resuming reconciliation: the payment status endpoint answers", "why", why)
			}
		}})
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, holder: inbox.NewHolder("reconciler"), circuit: circuit, log: log,
		idle: min(max(cfg.After/4, 100*time.Millisecond), 5*time.Second)}, nil
}

// maxProbeInterval caps the doubling wait between two probes of a status endpoint that looks down.
const maxProbeInterval = time.Minute

// workers is how many of an instance's requests may be out at once: enough to keep to the rate
// limit at a second a request, never more than 16.
func (r *Reconciler) workers() int { return min(16, max(1, int(r.cfg.RateLimit+0.5))) }

// Run asks until ctx is done, and returns nil then.
func (r *Reconciler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range r.workers() {
		wg.Go(func() { r.work(ctx) })
	}
	wg.Wait()
	return nil
}

// work claims the orders due first, a few at a time, and asks about each in turn, until ctx is
// done. While the circuit is paused it asks nothing, but the probe, and gives back what it holds.
func (r *Reconciler) work(ctx context.Context) {
	for {
		permit, err := r.circuit.Wait(ctx)
		if err != nil {
			return
		}
		orders, err := r.claim(ctx)
		if err != nil || len(orders) == 0 {
			r.circuit.Unused(permit)
			if err != nil && ctx.Err() == nil {
				r.log.DebugContext(ctx, "cannot look for orders to reconcile", "error", err)
			}
			if wait.Sleep(ctx, r.idle) != nil {
				return
			}
			continue
		}
		r.askAll(ctx, orders, permit)
	}
}

// askAll asks about each of orders in turn, the first with permit, and gives back those it does not
// ask about: all of them once ctx is done, the rest once the circuit pauses. A probe asks about an
// order whose failure did not pause the circuit, if it holds one: its failure confirms an outage.
func (r *Reconciler) askAll(ctx context.Context, orders []string, permit gate.Permit) {
	if permit.Probe() {
		if i := slices.IndexFunc(orders, func(o string) bool { return !r.circuit.Tripped(o) }); i > 0 {
			orders[0], orders[i] = orders[i], orders[0]
		}
	}
	for i, orderNo := range orders {
		if i > 0 {
			var ok bool
			if permit, ok = r.circuit.Allow(); !ok {
				r.release(context.WithoutCancel(ctx), orders[i:])
				return
			}
		}
		if err := r.turn(ctx); err != nil {
			r.circuit.Unused(permit)
			r.release(context.WithoutCancel(ctx), orders[i:])
			return
		}
		a := r.cfg.Status.Ask(ctx, orderNo)
		switch {
		case ctx.Err() != nil:
			r.circuit.Unused(permit)
			r.release(context.WithoutCancel(ctx), orders[i:])
			return
		case a.Result == ResultError:
			r.circuit.Failed(permit, orderNo)
		default:
			r.circuit.Answered(permit, orderNo)
		}
		r.settle(ctx, orderNo, a)
	}
}

// claimSQL holds the oldest orders due, up to $5, unless another instance holds them: PENDING past
// RECONCILE_AFTER and not past RECONCILE_MAX_AGE, never asked about or due again. They are read
// oldest first through the partial index of PENDING orders. SKIP LOCKED keeps instances claiming at
// once on different orders; the orders' rows are locked only while this statement lasts.
const claimSQL = `
WITH due AS (
	SELECT o.order_no FROM orders o LEFT JOIN payment_reconciliations r USING (order_no)
	WHERE o.status = 'PENDING'
	  AND o.created_at <= now() - $1 * interval '1 microsecond'
	  AND o.created_at > now() - $2 * interval '1 microsecond'
	  AND (r.order_no IS NULL OR (r.next_ask_at <= now() AND (r.held_until IS NULL OR r.held_until <= now())))
	ORDER BY o.created_at
	LIMIT $5
	FOR UPDATE OF o SKIP LOCKED
)
INSERT INTO payment_reconciliations AS r (order_no, next_ask_at, held_by, held_until)
SELECT order_no, now(), $3, now() + $4 * interval '1 microsecond' FROM due
ON CONFLICT (order_no) DO UPDATE SET held_by = excluded.held_by, held_until = excluded.held_until
WHERE r.next_ask_at <= now() AND (r.held_until IS NULL OR r.held_until <= now())
RETURNING order_no`

// claimBatch is how many orders a worker holds at once: its turns under the rate limit, its
// requests and its answers' records fit in holdFor many times over.
const claimBatch = 8

// claim holds the orders due first, up to claimBatch, and returns their numbers.
func (r *Reconciler) claim(ctx context.Context) ([]string, error) {
	rows, _ := r.cfg.Pool.Query(ctx, claimSQL, r.cfg.After.Microseconds(), r.cfg.MaxAge.Microseconds(),
		r.holder, holdFor.Microseconds(), claimBatch)
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// turn waits for this request's turn in the group's schedule.
func (r *Reconciler) turn(ctx context.Context) error {
	every := time.Duration(float64(time.Second) / r.cfg.RateLimit)
	in, err := r.cfg.Store.BookCalls(ctx, r.cfg.Group, statusHandler, 1, every)
	if err != nil {
		return err
	}
	if in <= 0 {
		return nil
	}
	return wait.Sleep(ctx, in)
}

// statusHandler names reconciliation's requests in the group's rate schedule (inbox_call_rates).
const statusHandler = "payment_status"

// release gives up the orders held, due again at once.
func (r *Reconciler) release(ctx context.Context, orders []string) {
	if len(orders) == 0 {
		return
	}
	_, _ = r.cfg.Pool.Exec(ctx, `
		UPDATE payment_reconciliations SET held_by = NULL, held_until = NULL
		WHERE order_no = ANY($1) AND held_by = $2`, orders, r.holder)
}

// settle records what the provider answered about orderNo, applying a payment it reports, in one
// transaction, and counts it once that commits.
func (r *Reconciler) settle(ctx context.Context, orderNo string, a Answer) {
	log := r.log.With("order_no", orderNo)
	if a.Result == ResultError {
		r.failed(ctx, orderNo, a.Err, log)
		return
	}
	var effect string
	err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
		var err error
		if a.Result == ResultPaid || a.Result == ResultFailed {
			effect, err = r.cfg.Payments.Reconciled(ctx, tx, "reconciliation:"+orderNo, a.Callback)
			if errors.Is(err, inboxworker.ErrAlreadyApplied) {
				effect, err = "", nil // its callback came meanwhile
			}
		}
		if err != nil {
			return err
		}
		return r.record(ctx, tx, orderNo, a.Result, "")
	})
	kind, _, _ := fault.Classify(inbox.Classify(err))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// Stopping, the answer not applied (or its commit's outcome unknown): asked about again at
		// the next start, and nothing reported of it here.
		r.release(context.WithoutCancel(ctx), []string{orderNo})
		return
	case kind == fault.KindPermanent:
		// The answer cannot be applied (a provider transaction bound to another order): a person
		// looks, and the order is asked about again at its next interval.
		log.ErrorContext(ctx, "cannot apply the provider's answer about the order", "result", a.Result, "error", err)
		_ = r.record(context.WithoutCancel(ctx), r.cfg.Pool, orderNo, ResultError, err.Error())
		r.cfg.Metrics.answered(ResultError)
		return
	default:
		r.release(context.WithoutCancel(ctx), []string{orderNo}) // Postgres: asked again once it is back
		return
	}
	r.cfg.Metrics.answered(a.Result)
	switch {
	case effect != "":
		log.WarnContext(ctx, "reconciliation found a payment whose callback never came; applied",
			"result", a.Result, "effect", effect, "provider", a.Callback.Provider,
			"provider_txn_id", a.Callback.ProviderTxnID)
	default:
		log.DebugContext(ctx, "asked the provider about the order", "result", a.Result)
	}
}

// failed records that the provider could not be asked about orderNo: not an answer, but the
// order waits its interval as after one, a minute at most, so that an order the endpoint always
// fails on is not asked about again and again, and one an outage failed is asked again soon after.
func (r *Reconciler) failed(ctx context.Context, orderNo string, err error, log *slog.Logger) {
	_ = r.schedule(ctx, r.cfg.Pool, orderNo, ResultError, err.Error(), false)
	r.cfg.Metrics.answered(ResultError)
	log.WarnContext(ctx, "cannot ask the payment provider about an order", "error", err)
}

// execer is what a pool and a transaction share.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// record records an answer about orderNo, held by r, and when to ask again.
func (r *Reconciler) record(ctx context.Context, db execer, orderNo, result, problem string) error {
	return r.schedule(ctx, db, orderNo, result, problem, true)
}

// schedule records what came of asking about orderNo, held by r, answered or not, and when to ask
// again: after the doubling interval, which answers lengthen, up to an hour after an answer and a
// minute after a failure.
func (r *Reconciler) schedule(ctx context.Context, db execer, orderNo, result, problem string, answered bool) error {
	most := maxProbeInterval
	if answered {
		most = maxInterval
	}
	_, err := db.Exec(context.WithoutCancel(ctx), `
		UPDATE payment_reconciliations
		SET asks = asks + $7::int, last_result = $3, last_error = nullif(left($4, 4096), ''), last_asked_at = now(),
			next_ask_at = now() + least($5 * power(2, least(asks, 30)), $6) * interval '1 microsecond',
			held_by = NULL, held_until = NULL
		WHERE order_no = $1 AND held_by = $2`,
		orderNo, r.holder, result, problem, r.cfg.After.Microseconds(), most.Microseconds(), b2i(answered))
	return err
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
