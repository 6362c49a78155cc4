package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestProcessOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := inbox.NewStore(pool, inbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (n int)`); err != nil {
		t.Fatal(err)
	}
	effect := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES (1)`)
		return err
	}
	msg := inbox.Message{Handler: "h", Key: "k1", Fingerprint: inbox.Fingerprint([]byte("v1")), Topic: "t"}
	for i, want := range []inbox.Outcome{inbox.Applied, inbox.Duplicate} {
		got, err := store.Process(ctx, msg, effect)
		if err != nil || got != want {
			t.Fatalf("delivery %d: got %q, %v; want %q", i+1, got, err, want)
		}
	}
	reused := msg
	reused.Fingerprint = inbox.Fingerprint([]byte("v2"))
	if got, err := store.Process(ctx, reused, effect); err != nil || got != inbox.KeyReused {
		t.Fatalf("reused key: got %q, %v; want %q", got, err, inbox.KeyReused)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("effects = %d, %v; want 1", n, err)
	}
}
