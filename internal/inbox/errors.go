package inbox

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxworker/inboxworker/internal/fault"
)

// SQLSTATE codes and classes that Classify acts on.
const (
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateLockNotAvailable     = "55P03" // lock_timeout
	sqlstateQueryCanceled        = "57014" // statement_timeout
	sqlstateAdminShutdown        = "57P01" // pg_terminate_backend, a fast shutdown
	sqlstateCrashShutdown        = "57P02"
	sqlstateCannotConnectNow     = "57P03" // starting up, shutting down, in recovery
	sqlstateReadOnlyTransaction  = "25006" // connected to a standby, as during a failover
	sqlstateProtocolViolation    = "08P01" // a FATAL one ends the connection; an ERROR refuses one message
	sqlstateClassConnection      = "08"    // connection exception
	sqlstateClassResources       = "53"    // insufficient resources: disk full, too many connections
)

// Classify translates a Postgres error into the worker's terms (see package fault), by SQLSTATE
// code and never by text:
//   - serialization failure, deadlock, lock timeout, statement timeout: retryable;
//   - a lost or refused connection, any failure to connect, a server shutting down, starting up or
//     out of resources (classes 08 and 53, 57P01–57P03), a read-only server (25006, a standby
//     during a failover): unavailable, retried without limit since it is no message's fault;
//   - a protocol violation that is no more than an ERROR (08P01): Postgres refused the message it
//     was sent and the connection goes on, as when a parameter sent inside the statement's text
//     (default_query_exec_mode=simple_protocol) holds a NUL: the message's own fault, permanent;
//   - a query that ran out of its context's deadline: retryable;
//   - anything else from Postgres: returned as it is, which fault.Classify treats as permanent.
//
// Errors that already carry a classification, and nil, are returned unchanged. Callers never need
// pgconn to decide what to do with an error.
func Classify(err error) error {
	var classified *fault.Error
	if err == nil || errors.As(err, &classified) {
		return err
	}
	// Checked before the server's own code: a server refusing a connection (bad password, too many
	// clients, no such database) is an outage for the worker, whatever it says.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return fault.Unavailable(err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case code == sqlstateSerializationFailure, code == sqlstateDeadlockDetected,
			code == sqlstateLockNotAvailable, code == sqlstateQueryCanceled:
			return fault.Retryable(err)
		case code == sqlstateProtocolViolation && pgErr.Severity == "ERROR":
			return err
		case strings.HasPrefix(code, sqlstateClassConnection), strings.HasPrefix(code, sqlstateClassResources),
			code == sqlstateAdminShutdown, code == sqlstateCrashShutdown, code == sqlstateCannotConnectNow,
			code == sqlstateReadOnlyTransaction:
			return fault.Unavailable(err)
		}
		return err
	}
	if isConnectionError(err) {
		return fault.Unavailable(err)
	}
	if pgconn.Timeout(err) {
		return fault.Retryable(err)
	}
	return err
}

// isConnectionError reports whether err means the database could not be reached or the connection
// broke: no answer from the server, as opposed to an answer that says no.
func isConnectionError(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) && !netErr.Timeout() {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, pgconn.ErrConnClosed) || pgconn.SafeToRetry(err)
}

// ErrorClass is the class of err, when Postgres answered it, by which errors are told alike:
// "SQLSTATE " and its code. data reports whether the code is about the data a statement carried
// (class 22, a data exception; class 23, an integrity constraint violation) rather than about the
// database (a privilege, a table or a column missing, a read-only server). It is "", false for an
// error Postgres did not answer.
func ErrorClass(err error) (class string, data bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return "", false
	}
	return "SQLSTATE " + pgErr.Code, strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")
}
