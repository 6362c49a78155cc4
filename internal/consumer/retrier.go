package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/effect"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// parkedKeys is the set of the ordering keys of one partition that have a message in the park: a
// message of such a key is parked behind them, without running. The set mirrors the park under its
// lock: a key is added as its first message is parked, and dropped only once the park holds none of
// its messages, each checked in Postgres with the lock held, so that a message parked behind its key
// at the moment the key's last parked message leaves is never overtaken.
type parkedKeys struct {
	store     *inbox.Store
	topic     string
	partition int32

	mu   sync.Mutex
	keys map[string]bool
}

// loadParkedKeys reads the keys parked from topic's partition: a new owner's.
func loadParkedKeys(ctx context.Context, store *inbox.Store, topic string, partition int) (*parkedKeys, error) {
	keys, err := store.ParkedKeys(ctx, topic, int32(partition))
	if err != nil {
		return nil, err
	}
	k := &parkedKeys{store: store, topic: topic, partition: int32(partition), keys: make(map[string]bool, len(keys))}
	for _, key := range keys {
		k.keys[string(key)] = true
	}
	return k, nil
}

// parked reports whether a message of orderingKey is parked.
func (k *parkedKeys) parked(orderingKey []byte) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys[string(orderingKey)]
}

// park parks p, due in retryIn once it is its key's head.
func (k *parkedKeys) park(ctx context.Context, p inbox.Parked, retryIn time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, err := k.store.Park(ctx, p, retryIn); err != nil {
		return err
	}
	k.keys[string(p.OrderingKey)] = true
	return nil
}

// parkBehind parks p behind its key if a message of the key is parked, and reports whether it did.
func (k *parkedKeys) parkBehind(ctx context.Context, p inbox.Parked) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.keys[string(p.OrderingKey)] {
		return false, nil
	}
	if _, err := k.store.Park(ctx, p, 0); err != nil {
		return false, err
	}
	return true, nil
}

// left is told that a message of orderingKey left the park: the key is dropped if none is left.
func (k *parkedKeys) left(ctx context.Context, orderingKey []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	parked, err := k.store.IsParked(ctx, k.topic, k.partition, orderingKey)
	if err != nil {
		return err
	}
	if !parked {
		delete(k.keys, string(orderingKey))
	}
	return nil
}

// len returns how many keys are parked.
func (k *parkedKeys) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

// retrierConfig is what a partition's retrier of parked messages works with.
type retrierConfig struct {
	store     *inbox.Store
	route     Route
	partition int
	// owner names the retrier in its claims; unique to it.
	owner string
	// lease is how long a claim lasts: longer than an attempt.
	lease time.Duration
	retry Retry
	// circuit is the route's; nil when it has none.
	circuit *circuit
	keys    *parkedKeys
	// slots, when set, are the route's: a retry takes one, as a message does, and waits out a pause
	// of the route (a Retry-After).
	slots *routeLimit
	// apply runs the handler on p, which is claimed: its effect, inbox row and removal from the park
	// in one transaction, or as the handler's phases require (see parkedEffect).
	apply func(ctx context.Context, p inbox.Parked) (inbox.Outcome, error)
	// classify tells what a failed attempt's error means (see partition.classify).
	classify func(ctx context.Context, err error) (fault.Kind, fault.Reason, time.Duration)
	// deadLetter writes m's dead letter, synchronously; an error means it was not written.
	deadLetter func(ctx context.Context, m kafka.Message, reason fault.Reason, err error, attempts int) error
	// finished counts a message that left the park with outcome; retried counts a retry. Either may
	// be nil.
	finished func(outcome string)
	retried  func()
	// poll is the longest wait between two looks at the park while it holds messages of the
	// partition; idle, while it holds none (0: poll). A message parked by this partition wakes the
	// retrier at once; idle bounds how long one parked by an owner that has just lost the partition
	// waits to be found.
	poll, idle time.Duration
	log        *slog.Logger
}

// retrier retries the parked messages of one partition, for the generation that owns it: the due
// head of each key in turn, on the backoff and retry budget of Config.Retry, until it is applied,
// found a duplicate or dead-lettered, and the key's next message gets its turn. It keeps to its
// route's circuit: while the route is paused it takes no message but the probe, and no time the
// route is paused, nor any failure while it is, is charged to a message's budget.
type retrier struct {
	retrierConfig
	wakeup chan struct{}
}

func newRetrier(config retrierConfig) *retrier {
	return &retrier{retrierConfig: config, wakeup: make(chan struct{}, 1)}
}

// wake makes the retrier look at the park now: something was parked.
func (r *retrier) wake() {
	select {
	case r.wakeup <- struct{}{}:
	default:
	}
}

// run retries until ctx is done, then gives up its claims, so that the partition's next owner need
// not wait for them to lapse.
func (r *retrier) run(ctx context.Context) {
	defer r.releaseAll(ctx)
	if r.keys.len() == 0 {
		// Nothing parked from the partition: nothing to look at until something is parked.
		r.sleep(ctx, max(r.idle, r.poll))
	}
	var outage *backoff.ExponentialBackOff
	for ctx.Err() == nil {
		limit, wait := r.mayTake()
		if limit == 0 {
			r.sleep(ctx, wait)
			continue
		}
		taken, err := r.store.TakeDue(ctx, r.route.Topic, int32(r.partition), r.owner, r.lease, limit)
		if err == nil && len(taken) == 0 {
			wait, err = r.untilDue(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if outage == nil {
				outage = newOutageBackOff(r.retry)
			}
			delay := outage.NextBackOff()
			r.log.WarnContext(ctx, "cannot read the park; waiting for the database", "delay", delay, "error", err)
			r.sleep(ctx, delay)
			continue
		}
		outage = nil
		if len(taken) == 0 {
			r.sleep(ctx, wait)
			continue
		}
		tookAt := time.Now()
		for i, p := range taken {
			if ctx.Err() != nil {
				return
			}
			if time.Since(tookAt) > r.lease/2 {
				// The claims of the rest lapse soon: another owner may take them while they run.
				r.releaseRest(ctx, taken[i:])
				break
			}
			if r.retryOne(ctx, p) {
				if outage == nil {
					outage = newOutageBackOff(r.retry)
				}
				r.sleep(ctx, outage.NextBackOff())
				break
			}
		}
	}
}

// retryBatch is how many due messages a retrier takes at once, to retry one after another: finding
// the due heads costs a scan of the partition's parked keys.
const retryBatch = 32

// mayTake says how many due messages may be taken now (one, the probe, while the route is paused
// and a probe is due), or how long to wait before asking again.
func (r *retrier) mayTake() (int, time.Duration) {
	if r.circuit == nil {
		return retryBatch, 0
	}
	switch state, probeAt := r.circuit.State(); state {
	case RouteOpen:
		return retryBatch, 0
	case RoutePaused:
		if wait := time.Until(probeAt); wait > 0 {
			return 0, wait
		}
		return 1, 0
	}
	return 0, r.poll // probing: the probe's result changes the state
}

// untilDue returns how long until the next parked message is due, at most poll.
func (r *retrier) untilDue(ctx context.Context) (time.Duration, error) {
	wait, ok, err := r.store.NextDue(ctx, r.route.Topic, int32(r.partition))
	switch {
	case err != nil:
		return r.poll, err
	case !ok:
		return max(r.idle, r.poll), nil
	}
	return min(max(wait, time.Millisecond), r.poll), nil
}

// sleep waits for d, for a wake-up, for the route's circuit to change, or for ctx to be done.
func (r *retrier) sleep(ctx context.Context, d time.Duration) {
	var changed <-chan struct{}
	if r.circuit != nil {
		changed = r.circuit.Changed()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-r.wakeup:
	case <-changed:
	}
}

// retryOne retries p, which is claimed, once, and settles it: it leaves the park (applied, a
// duplicate, dead-lettered) or is rescheduled. It reports whether the database looked down, in
// which case p's claim is left to lapse if it could not be given back.
func (r *retrier) retryOne(ctx context.Context, p inbox.Parked) (outage bool) {
	log := r.log.With("topic", p.Topic, "partition", p.Partition, "offset", p.Offset, "key", p.IdempotencyKey,
		"parked_id", p.ID)
	starts, err := r.store.Begin(ctx, p)
	if err != nil {
		return r.settleFailed(ctx, "begin a retry of", err, log)
	}
	if starts > crashLoopStarts {
		err := fmt.Errorf("the worker died %d times in a row while retrying this parked message", starts-1)
		return r.deadLetterAndRemove(ctx, p, fault.CrashLoop, err, p.Attempts, log)
	}
	permit, ok := r.allow()
	if !ok {
		// The route paused since p was taken: p waits, nothing charged.
		return r.release(ctx, p, 0, log)
	}
	if !r.takeSlot(ctx) {
		r.record(permit, p, resultInconclusive)
		return false
	}
	began := time.Now()
	pausedBefore := r.paused()
	outcome, err := r.apply(ctx, p)
	if r.slots != nil {
		r.slots.release()
	}
	attempts := p.Attempts + 1
	switch {
	case err == nil && outcome == inbox.KeyReused:
		r.record(permit, p, resultAnswered)
		// The claim found the key reused: this attempt ran no handler.
		f := keyReused(p.IdempotencyKey, p.Attempts)
		return r.deadLetterAndRemove(ctx, p, f.reason, f.err, f.attempts, log)
	case err == nil:
		r.record(permit, p, resultAnswered)
		r.leave(ctx, p, string(outcome), attempts, log)
		return false
	case errors.Is(err, inbox.ErrClaimLost):
		r.record(permit, p, resultInconclusive)
		log.InfoContext(ctx, "another owner took the parked message over", "error", err)
		return false
	case ctx.Err() != nil:
		r.record(permit, p, resultInconclusive)
		return false
	}

	err = unwrapPermanent(err)
	kind, reason, retryAfter := r.classify(ctx, err)
	switch kind {
	case fault.KindPermanent:
		r.record(permit, p, resultAnswered)
		return r.deadLetterAndRemove(ctx, p, reason, err, attempts, log)
	case fault.KindUnavailable:
		r.record(permit, p, resultInconclusive)
		log.WarnContext(ctx, "the database is unavailable; the parked message waits for it", "error", err)
		r.release(ctx, p, 0, log)
		return true
	}

	r.record(permit, p, circuitResult(err, kind, reason))
	if retryAfter > 0 && r.slots != nil {
		r.slots.pause(retryAfter)
	}
	delay := max(r.backoff(attempts), retryAfter)
	// What the route's pause took, or a failure while it is paused (an outage, then), is not the
	// message's to pay.
	spent := time.Since(began) - (r.paused() - pausedBefore) + delay
	if r.circuit != nil {
		if state, _ := r.circuit.State(); state != RouteOpen {
			spent = 0
		}
	}
	if spent > 0 && p.BudgetSpent+spent > r.retry.MaxElapsed {
		return r.deadLetterAndRemove(ctx, p, reason, err, attempts, log)
	}
	if err := r.store.Reschedule(ctx, p, inbox.ParkedFailure{Err: err, Reason: reason, Spent: max(spent, 0), RetryIn: delay}); err != nil {
		return r.settleFailed(ctx, "reschedule", err, log)
	}
	if r.retried != nil {
		r.retried()
	}
	log.InfoContext(ctx, "retrying the parked message", "attempt", attempts, "delay", delay,
		"budget_spent", p.BudgetSpent+max(spent, 0), "error", err)
	return false
}

// deadLetterAndRemove dead-letters p, then takes it out of the park: the key's next message gets
// its turn. A dead letter written whose message could not be removed is written again by the next
// retry: never lost.
func (r *retrier) deadLetterAndRemove(ctx context.Context, p inbox.Parked, reason fault.Reason, err error, attempts int, log *slog.Logger) bool {
	if werr := r.deadLetter(ctx, fromParked(p), reason, err, attempts); werr != nil {
		if ctx.Err() == nil {
			log.ErrorContext(ctx, "cannot dead-letter the parked message; it stays parked", "error", werr)
			r.release(ctx, p, r.retry.InitialInterval, log)
		}
		return false
	}
	if rerr := r.store.Remove(ctx, p); rerr != nil {
		return r.settleFailed(ctx, "remove the dead-lettered message from the park", rerr, log)
	}
	r.leave(ctx, p, outcomeDeadLettered, attempts, log)
	return false
}

// leave records that p left the park with outcome.
func (r *retrier) leave(ctx context.Context, p inbox.Parked, outcome string, attempts int, log *slog.Logger) {
	if r.finished != nil {
		r.finished(outcome)
	}
	log.InfoContext(ctx, "unparked the message", "outcome", outcome, "attempts", attempts,
		"parked_for", time.Since(p.ParkedAt).Round(time.Millisecond))
	if err := r.keys.left(ctx, p.OrderingKey); err != nil && ctx.Err() == nil {
		// The key stays marked: its next message is parked behind, where it waits no longer than
		// a look at the park.
		log.WarnContext(ctx, "cannot tell whether the key has more messages parked", "error", err)
	}
}

// release gives p's claim back, due in retryIn, nothing charged. It reports whether the database
// looked down.
func (r *retrier) release(ctx context.Context, p inbox.Parked, retryIn time.Duration, log *slog.Logger) bool {
	if err := r.store.Release(ctx, p, retryIn); err != nil {
		return r.settleFailed(ctx, "release", err, log)
	}
	return false
}

// settleFailed logs a failed change to the park and reports whether the database looked down. The
// message keeps its claim until it lapses, then is retried: nothing is lost, and the inbox keeps a
// message applied once.
func (r *retrier) settleFailed(ctx context.Context, what string, err error, log *slog.Logger) bool {
	if ctx.Err() != nil || errors.Is(err, inbox.ErrClaimLost) {
		return false
	}
	log.WarnContext(ctx, "cannot "+what+" the parked message; its claim will lapse", "lease", r.lease, "error", err)
	kind, _, _ := fault.Classify(err)
	return kind == fault.KindUnavailable
}

// releaseRest gives back the claims on ps, not retried, due as they were.
func (r *retrier) releaseRest(ctx context.Context, ps []inbox.Parked) {
	for _, p := range ps {
		if err := r.store.Release(ctx, p, 0); err != nil && ctx.Err() == nil && !errors.Is(err, inbox.ErrClaimLost) {
			r.log.WarnContext(ctx, "cannot give back the claim on a parked message; it will lapse",
				"parked_id", p.ID, "error", err)
		}
	}
}

// releaseAll gives up the retrier's claims when it stops.
func (r *retrier) releaseAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := r.store.ReleaseAll(ctx, r.owner); err != nil {
		r.log.WarnContext(ctx, "cannot give up the claims on parked messages; they will lapse", "lease", r.lease, "error", err)
	}
}

// rollbackTimeout bounds the clean-up that runs once the retrier's context is done.
const rollbackTimeout = 5 * time.Second

// backoff returns the wait before attempt+1, as the backoff of Config.Retry: the initial interval
// doubled at each attempt, at most the maximum interval, with 50% jitter.
func (r *retrier) backoff(attempt int) time.Duration {
	d := r.retry.InitialInterval
	for i := 1; i < attempt && d < r.retry.MaxInterval; i++ {
		d *= 2
	}
	d = min(d, r.retry.MaxInterval)
	return time.Duration(float64(d) * (0.5 + rand.Float64())) // [0.5d, 1.5d)
}

// takeSlot waits for a slot of the route, and for a pause of the route to end; it fails only when
// ctx is done.
func (r *retrier) takeSlot(ctx context.Context) bool {
	if r.slots == nil {
		return true
	}
	for {
		if d := r.slots.pausedFor(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false
			}
			continue
		}
		select {
		case r.slots.slots <- struct{}{}:
			return true
		case <-ctx.Done():
			return false
		}
	}
}

func (r *retrier) allow() (permit, bool) {
	if r.circuit == nil {
		return permit{}, true
	}
	return r.circuit.Allow()
}

func (r *retrier) record(p permit, m inbox.Parked, res result) {
	if r.circuit != nil {
		r.circuit.Record(p, string(m.OrderingKey), res)
	}
}

func (r *retrier) paused() time.Duration {
	if r.circuit == nil {
		return 0
	}
	return r.circuit.Paused()
}

// parkedEffect is the apply of a retrier: the route's handler runs on p, which is claimed, under a
// context bounded by attemptTimeout, and p leaves the park with its effect. A Handler runs in one
// transaction with p's inbox row and its removal from the park (inbox.Store.ProcessParked). A
// CallHandler goes through its three steps, p's removal in the completion's transaction; a claim on
// p lost meanwhile does not undo a call already made: the completion commits, and the next owner
// finds the key applied. A key applied already (a duplicate) takes p out of the park. A panic in the
// handler rolls back and is a permanent error.
func parkedEffect(store *inbox.Store, route Route, attemptTimeout time.Duration, log *slog.Logger) func(context.Context, inbox.Parked) (inbox.Outcome, error) {
	return func(ctx context.Context, p inbox.Parked) (inbox.Outcome, error) {
		ctx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		log := log.With("topic", p.Topic, "offset", p.Offset, "key", p.IdempotencyKey)
		d := inbox.Delivery{Key: p.IdempotencyKey, Value: p.Value, Attempt: p.Attempts + 1}
		h, ok := route.Handler.(effect.CallHandler)
		if !ok {
			h := route.Handler.(effect.Handler) // Config.validate admits nothing else
			return store.ProcessParked(ctx, p, func(ctx context.Context, tx pgx.Tx) (err error) {
				defer recoverHandler(ctx, log, &err)
				return h.Handle(ctx, tx, d)
			})
		}
		unpark := func(ctx context.Context, tx pgx.Tx) error {
			if err := store.UnparkTx(ctx, tx, p); err != nil && !errors.Is(err, inbox.ErrClaimLost) {
				return err
			}
			return nil
		}
		outcome, err := store.ProcessCall(ctx, parkedMessage(p), callSteps(h, route.CallLease, d, log, unpark))
		if err == nil && outcome == inbox.Duplicate {
			// Recorded before, by another delivery: no call was made, and p goes.
			if err := store.Remove(ctx, p); err != nil && !errors.Is(err, inbox.ErrClaimLost) {
				return "", err
			}
		}
		return outcome, err
	}
}

// parkedMessage is p as the inbox records it.
func parkedMessage(p inbox.Parked) inbox.Message {
	return inbox.Message{
		Handler:     p.Handler,
		Key:         p.IdempotencyKey,
		Fingerprint: inbox.Fingerprint(p.Value),
		Topic:       p.Topic,
		Partition:   p.Partition,
		Offset:      p.Offset,
	}
}

// newOutageBackOff paces the waits for a database that is down, as partition.outageBackOff does.
func newOutageBackOff(retry Retry) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(retry.InitialInterval),
		backoff.WithMaxInterval(min(retry.MaxInterval, maxOutageInterval)),
		backoff.WithMaxElapsedTime(0),
	)
}
