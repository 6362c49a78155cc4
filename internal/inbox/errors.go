package inbox

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/inboxworker/inboxworker/internal/fault"
)

// SQLSTATE codes that make a transaction worth retrying as it is.
const (
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateLockNotAvailable     = "55P03" // lock_timeout
)

// Classify translates a Postgres error into the worker's terms (see package fault), by SQLSTATE
// code and never by text:
//   - serialization failure, deadlock, lock timeout: retryable;
//   - a lost or refused connection, a server shutting down or starting up (class 08, 57P01–57P03):
//     unavailable, retried without limit since it is no message's fault;
//   - a query timeout: retryable;
//   - anything else from Postgres: returned as it is, which fault.Classify treats as permanent.
//
// Errors that already carry a classification, and nil, are returned unchanged. Callers never need
// pgconn to decide what to do with an error.
func Classify(err error) error {
	var classified *fault.Error
	if err == nil || errors.As(err, &classified) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == sqlstateSerializationFailure, pgErr.Code == sqlstateDeadlockDetected,
			pgErr.Code == sqlstateLockNotAvailable:
			return fault.Retryable(err)
		case pgErr.Code[:2] == "08", pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03":
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
	if errors.Is(err, context.Canceled) {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && !netErr.Timeout() {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err)
}
