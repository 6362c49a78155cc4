// Package fault classifies errors by what the worker must do with them: retry the message in place,
// wait for a dependency to come back, or dead-letter it with a reason code.
//
// It is the one place where that decision is encoded. Handlers wrap their errors with Permanent,
// Retryable or Unavailable; the consumer reads them back with Classify. An error nobody classified is
// permanent, except timeouts, which the contract makes retryable. fault knows nothing of Kafka,
// Postgres or HTTP: the packages that talk to those translate their errors at their own boundary.
package fault

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// Kind says what to do with a failed message.
type Kind int

const (
	// KindPermanent: dead-letter at once.
	KindPermanent Kind = iota
	// KindRetryable: retry in place with backoff until the retry budget runs out, then dead-letter.
	KindRetryable
	// KindUnavailable: a dependency (Postgres) is down. Not the message's fault: wait and retry
	// without limit, never dead-letter.
	KindUnavailable
)

func (k Kind) String() string {
	switch k {
	case KindRetryable:
		return "retryable"
	case KindUnavailable:
		return "unavailable"
	default:
		return "permanent"
	}
}

// Error is a classified error.
type Error struct {
	Kind Kind
	// Reason is the dead-letter reason: for a permanent error the reason itself, for a retryable one
	// the reason used once retries run out (RetriesExhausted when empty).
	Reason inboxtype.Reason
	// RetryAfter, when positive, is the least time to wait before the next attempt (an HTTP
	// Retry-After, say). Retryable errors only.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return string(e.Reason)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying: the message is dead-lettered with reason.
func Permanent(reason inboxtype.Reason, err error) error {
	return &Error{Kind: KindPermanent, Reason: reason, Err: err}
}

// Retryable marks err as worth retrying with backoff; when retries run out the message is
// dead-lettered with reason RetriesExhausted.
func Retryable(err error) error {
	return &Error{Kind: KindRetryable, Err: err}
}

// RetryableAfter is Retryable, tried again no sooner than after: a service's Retry-After.
func RetryableAfter(err error, after time.Duration) error {
	return &Error{Kind: KindRetryable, RetryAfter: after, Err: err}
}

// RetryableUntil is Retryable with the reason to dead-letter with once retries run out.
func RetryableUntil(reason inboxtype.Reason, err error) error {
	return &Error{Kind: KindRetryable, Reason: reason, Err: err}
}

// Unavailable marks err as an outage of a dependency: retried without limit, never dead-lettered.
func Unavailable(err error) error {
	return &Error{Kind: KindUnavailable, Err: err}
}

// Classify tells what to do with err. The outermost *Error in the chain decides. An unclassified
// error is permanent with reason HandlerError, except timeouts and context deadlines (retryable)
// and network errors (retryable).
func Classify(err error) (kind Kind, reason inboxtype.Reason, retryAfter time.Duration) {
	var fe *Error
	if errors.As(err, &fe) {
		reason = fe.Reason
		if reason == "" {
			reason = inboxtype.RetriesExhausted
			if fe.Kind == KindPermanent {
				reason = inboxtype.HandlerError
			}
		}
		return fe.Kind, reason, fe.RetryAfter
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) {
		return KindRetryable, inboxtype.RetriesExhausted, 0
	}
	return KindPermanent, inboxtype.HandlerError, 0
}
