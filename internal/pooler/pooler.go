// Package pooler tells whether a pool's connections reach Postgres through a connection pooler in
// transaction mode (PgBouncer's pool_mode = transaction, RDS Proxy, Supavisor): one where a client
// connection is given a server connection only for the length of a transaction, so that nothing a
// session sets up — a prepared statement, a session advisory lock, a SET — can be relied on in the
// next transaction.
package pooler

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TransactionMode reports whether two connections of pool, held at once, are answered by one
// Postgres server process: then a pooler between them hands server connections out per
// transaction. Straight to Postgres, or through a pooler in session mode, every connection has a
// server process of its own. A pooler that hands an idle server connection to the next client
// (PgBouncer does, by default) is told at once; one that would not is not seen, and is reported
// false. So is a pool of one connection, which cannot hold two.
func TransactionMode(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	if pool.Config().MaxConns < 2 {
		return false, nil
	}
	first, err := backend(ctx, pool)
	if err != nil {
		return false, err
	}
	defer first.conn.Release()
	second, err := backend(ctx, pool)
	if err != nil {
		return false, err
	}
	defer second.conn.Release()
	return first.pid == second.pid, nil
}

type held struct {
	conn *pgxpool.Conn
	pid  int32
}

// backend acquires a connection of pool and asks which server process answers it. The question
// ends its transaction, so that a pooler in transaction mode gives the server connection back.
func backend(ctx context.Context, pool *pgxpool.Pool) (held, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return held{}, err
	}
	var pid int32
	// In the simple protocol, which prepares nothing: a statement pgx prepared on the first
	// connection would already exist on the second when the two share a server process.
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		conn.Release()
		return held{}, fmt.Errorf("which server process answers: %w", err)
	}
	return held{conn: conn, pid: pid}, nil
}
