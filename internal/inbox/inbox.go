// Package inbox makes a message's side effect happen once in Postgres, however often the message
// arrives.
//
// Store.Process claims the message's idempotency key in the inbox table and runs the side effect in
// the same transaction: the key is recorded if and only if the effect committed. A redelivery finds
// the key and skips the effect (Duplicate); the same key with a different payload is refused
// (KeyReused); a failed effect leaves no row, so a retry runs it normally. Concurrent deliveries of
// one key are arbitrated by the primary key: the second claim waits for the first transaction and
// then sees its outcome.
//
// An effect reports what it did with AfterCommit: its actions run once the transaction committed,
// and never for one rolled back.
//
// A key is remembered for its handler's retention (Config.Retention), then deleted by Purge, which
// RunPurger calls periodically; a redelivery after that is applied again.
//
// The park (Store.Park: Park.Add, Park.TakeDue, Park.Process) holds messages that wait for a retry
// out of their partition's way, each key's in offset order, and applies one with its removal from
// the park in one transaction; the start log (Store.StartLog) records the ranges of messages a
// consumer starts, for its crash-loop guard. "Claim" is the inbox row's word only: a call takes a
// lease on its key (ProcessCall), a retrier holds a parked message.
//
// inbox knows Postgres and nothing of Kafka: origin offsets are stored for operators, not read.
// It does not retry; it classifies Postgres errors (see Classify) so that its caller can.
package inbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// Outcome is what Process did with a message.
type Outcome string

const (
	// Applied: the key was new and the effect committed with it.
	Applied Outcome = "applied"
	// Duplicate: the key was already recorded with the same payload; the effect did not run.
	// Also returned when the effect reports ErrAlreadyApplied.
	Duplicate Outcome = "duplicate"
	// KeyReused: the key was already recorded with a different payload; the effect did not run.
	KeyReused Outcome = "key_reused"
	// Expired: the effect declined the message as too late to be of use (Decline): the key
	// committed with what else the effect wrote, its substance (a call, say) not done.
	Expired Outcome = "expired"
	// Suppressed: the effect declined the message as over a limit (a recipient's, say): the key
	// committed with what else the effect wrote, its substance not done.
	Suppressed Outcome = "suppressed"
)

// ErrAlreadyApplied is returned by an effect that finds, by its own business keys, that this
// message's effect already happened under another idempotency key (a payment provider resending one
// transaction under a new event id). Process then commits the inbox row, writing nothing else the
// effect did not write, and reports Duplicate. The transaction must still be usable: after a
// failed statement the commit fails, and Process returns that error instead.
var ErrAlreadyApplied = inboxtype.ErrAlreadyApplied

// Declined reports whether o is an outcome of Decline: Expired or Suppressed.
func (o Outcome) Declined() bool { return o == Expired || o == Suppressed }

// Decline returns the error with which an effect declines its message on purpose, outcome Expired
// or Suppressed, err saying why: as for ErrAlreadyApplied, the key's inbox row commits with what
// else the effect wrote (its record of the decision), so that a redelivery is a Duplicate, and
// Process reports outcome. A call's Check declining ends the call before it is made. For any other
// outcome Decline returns an error that declines nothing.
func Decline(outcome Outcome, err error) error {
	if !outcome.Declined() {
		return fmt.Errorf("inbox: a message is declined expired or suppressed, not %q: %w", outcome, err)
	}
	return &declined{outcome: outcome, err: err}
}

// declined is the error of Decline.
type declined struct {
	outcome Outcome
	err     error
}

func (d *declined) Error() string {
	if d.err == nil {
		return "inbox: declined: " + string(d.outcome)
	}
	return "inbox: declined: " + string(d.outcome) + ": " + d.err.Error()
}

func (d *declined) Unwrap() error { return d.err }

// recordedBy returns the outcome with which an effect's error err records its message's key, and
// true: Duplicate for ErrAlreadyApplied, the outcome of Decline. Any other error records nothing.
func recordedBy(err error) (Outcome, bool) {
	var d *declined
	switch {
	case errors.As(err, &d):
		return d.outcome, true
	case errors.Is(err, ErrAlreadyApplied):
		return Duplicate, true
	}
	return "", false
}

// Message identifies one delivery to process.
type Message struct {
	// Handler names the consumer of the message ("payments", "sms"). Keys are unique per handler.
	Handler string
	// Key is the idempotency key.
	Key string
	// Fingerprint is the SHA-256 of the message value; see Fingerprint.
	Fingerprint [sha256.Size]byte
	// Where the message was read from, recorded for operators.
	Topic     string
	Partition int32
	Offset    int64
}

// Fingerprint returns the SHA-256 of a message value.
func Fingerprint(value []byte) [sha256.Size]byte { return sha256.Sum256(value) }

// Effect is a message's side effect. It runs inside the inbox transaction and must do all of its
// database work through tx. An error rolls back everything, the claim included.
type Effect = inboxtype.Completion

// Config configures a Store.
type Config struct {
	// Retention is how long each handler's keys are remembered, by handler name.
	// Handlers not named get DefaultRetention.
	Retention map[string]time.Duration
	// DefaultRetention defaults to 72h.
	DefaultRetention time.Duration
	// PurgeBatchSize is how many expired keys Purge deletes per transaction. Defaults to 5000.
	PurgeBatchSize int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Store is the inbox table.
type Store struct {
	pool   *pgxpool.Pool
	config Config
	// leaseTakers and completers hold a grouper per handler name, of the lease requests and of
	// the completions of the handler's calls (see ProcessCall): the groups in which they commit.
	leaseTakers, completers sync.Map
	park                    *Park
	starts                  *StartLog
}

// NewStore returns a Store over pool, which must reach a migrated database.
func NewStore(pool *pgxpool.Pool, config Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("inbox: pool is required")
	}
	config.Retention = maps.Clone(config.Retention) // the caller's map may change later
	config.DefaultRetention = cmp.Or(config.DefaultRetention, 72*time.Hour)
	config.PurgeBatchSize = cmp.Or(config.PurgeBatchSize, defaultPurgeBatchSize)
	config.Logger = cmp.Or(config.Logger, slog.Default())
	if config.DefaultRetention < 0 {
		return nil, fmt.Errorf("inbox: DefaultRetention must be positive, got %s", config.DefaultRetention)
	}
	if config.PurgeBatchSize < 0 {
		return nil, fmt.Errorf("inbox: PurgeBatchSize must be positive, got %d", config.PurgeBatchSize)
	}
	for handler, d := range config.Retention {
		if d <= 0 {
			return nil, fmt.Errorf("inbox: Retention[%q] must be positive, got %s", handler, d)
		}
	}
	s := &Store{pool: pool, config: config, starts: &StartLog{pool: pool}}
	s.park = &Park{store: s, pool: pool}
	return s, nil
}

// Park returns the store's park: the messages that wait, out of their partition's way, for a retry.
func (s *Store) Park() *Park { return s.park }

// StartLog returns the store's log of the ranges of messages a consumer started, its crash-loop
// guard's.
func (s *Store) StartLog() *StartLog { return s.starts }

// Retention returns how long handler's keys are remembered.
func (s *Store) Retention(handler string) time.Duration {
	if d, ok := s.config.Retention[handler]; ok {
		return d
	}
	return s.config.DefaultRetention
}

// Process claims msg's key and runs effect in one transaction. It returns Applied when the effect
// committed with the claim, Duplicate or KeyReused when the key was already recorded (the effect
// did not run), Duplicate, Expired or Suppressed when the effect reported ErrAlreadyApplied or
// declined the message (see Decline: the key and the effect's writes committed), or an error, in
// which case nothing was recorded. Errors from Postgres are
// classified (see Classify), the effect's included when they come from Postgres; the effect's
// other errors are returned as they are.
func (s *Store) Process(ctx context.Context, msg Message, effect Effect) (Outcome, error) {
	if msg.Handler == "" || msg.Key == "" {
		return "", fmt.Errorf("inbox: message needs a handler and a key, got %q and %q", msg.Handler, msg.Key)
	}
	var outcome Outcome
	err := WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		outcome, err = s.claim(ctx, tx, msg)
		if err != nil || outcome != Applied {
			return err
		}
		if err := effect(ctx, tx); err != nil {
			recorded, ok := recordedBy(err)
			if !ok {
				return classifyEffectError(ctx, tx, err)
			}
			outcome = recorded
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return outcome, nil
}

// classifyEffectError classifies the effect's error when Postgres caused it: a Postgres error, or
// any error once the transaction's connection is gone. Other errors (an HTTP call's, a handler's
// own) are the effect's business and are returned as they are.
func classifyEffectError(ctx context.Context, tx pgx.Tx, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return Classify(err)
	case ctx.Err() == nil && tx.Conn().PgConn().IsClosed():
		return Classify(fmt.Errorf("inbox: connection lost during the effect: %w", err))
	}
	return err
}

const claimSQL = `
INSERT INTO inbox (handler, idempotency_key, fingerprint, topic, "partition", "offset", expires_at)
VALUES ($1, $2, $3, $4, $5, $6, now() + $7 * interval '1 microsecond')
ON CONFLICT (handler, idempotency_key) DO NOTHING`

// claim inserts msg's inbox row. On a conflict it waits for the transaction holding the key, as
// Postgres does for a unique index, and then reports Duplicate or KeyReused by the stored fingerprint.
func (s *Store) claim(ctx context.Context, tx pgx.Tx, msg Message) (Outcome, error) {
	tag, err := tx.Exec(ctx, claimSQL, msg.Handler, msg.Key, msg.Fingerprint[:], msg.Topic,
		msg.Partition, msg.Offset, s.Retention(msg.Handler).Microseconds())
	if err != nil {
		return "", Classify(fmt.Errorf("inbox: claim: %w", err))
	}
	if tag.RowsAffected() == 1 {
		return Applied, nil
	}
	var stored []byte
	err = tx.QueryRow(ctx,
		`SELECT fingerprint FROM inbox WHERE handler = $1 AND idempotency_key = $2`,
		msg.Handler, msg.Key).Scan(&stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Purged between the conflict and this read: the key has expired, so it is new again.
		return s.claim(ctx, tx, msg)
	case err != nil:
		return "", Classify(fmt.Errorf("inbox: read claimed key: %w", err))
	case string(stored) == string(msg.Fingerprint[:]):
		return Duplicate, nil
	default:
		return KeyReused, nil
	}
}

// WithTx runs fn in a transaction on db and commits it if fn returns nil. A transaction that fn
// fails, or panics in, is rolled back even when ctx is already cancelled, so none is left open.
// The actions fn registers with AfterCommit run once the commit succeeded, never otherwise.
// Errors from Postgres in beginning and committing are classified (see Classify); fn's errors are
// returned as they are.
func WithTx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return Classify(fmt.Errorf("inbox: begin: %w", err))
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	txCtx, actions := withAfterCommit(ctx)
	if err := fn(txCtx, tx); err != nil {
		return err
	}
	// A failed commit has ended the transaction too: there is nothing left to roll back.
	committed = true
	if err := tx.Commit(ctx); err != nil {
		return Classify(fmt.Errorf("inbox: commit: %w", err))
	}
	actions.run(ctx)
	return nil
}

// rollbackTimeout bounds the rollback of a failed transaction, which runs without the caller's
// context: long enough for a healthy server, short enough not to hang on a dead one.
const rollbackTimeout = 5 * time.Second

// Delivery is what a handler sees of one message.
type Delivery = inboxtype.Delivery

// Ping checks that the database answers. An error is classified (see Classify): unavailable when
// the database cannot be reached.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return Classify(fmt.Errorf("inbox: ping: %w", err))
	}
	return nil
}
