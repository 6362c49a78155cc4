package fault_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	tests := []struct {
		name       string
		err        error
		kind       fault.Kind
		reason     inboxtype.Reason
		retryAfter time.Duration
	}{
		{"Unclassified", base, fault.KindPermanent, inboxtype.HandlerError, 0},
		{"Permanent", fault.Permanent(inboxtype.InvalidPayload, base), fault.KindPermanent, inboxtype.InvalidPayload, 0},
		{"PermanentWithoutReason", fault.Permanent("", base), fault.KindPermanent, inboxtype.HandlerError, 0},
		{"PermanentWrapped", fmt.Errorf("decode: %w", fault.Permanent(inboxtype.InvalidPayload, errors.New("bad amount"))),
			fault.KindPermanent, inboxtype.InvalidPayload, 0},
		{"Retryable", fault.Retryable(base), fault.KindRetryable, inboxtype.RetriesExhausted, 0},
		{"RetryableUntil", fault.RetryableUntil(reasonUnknownOrder, base), fault.KindRetryable, reasonUnknownOrder, 0},
		{"RetryAfter", &fault.Error{Kind: fault.KindRetryable, RetryAfter: time.Second, Err: base},
			fault.KindRetryable, inboxtype.RetriesExhausted, time.Second},
		{"Unavailable", fault.Unavailable(base), fault.KindUnavailable, inboxtype.RetriesExhausted, 0},
		{"DeadlineExceeded", fmt.Errorf("send: %w", context.DeadlineExceeded), fault.KindRetryable, inboxtype.RetriesExhausted, 0},
		{"NetError", &net.OpError{Op: "dial", Err: base}, fault.KindRetryable, inboxtype.RetriesExhausted, 0},
		{"OutermostWins", fault.Permanent(reasonProviderRejected, fault.Retryable(base)), fault.KindPermanent, reasonProviderRejected, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kind, reason, retryAfter := fault.Classify(tt.err)
			if kind != tt.kind || reason != tt.reason || retryAfter != tt.retryAfter {
				t.Errorf("Classify(%v) = %s, %q, %s; want %s, %q, %s",
					tt.err, kind, reason, retryAfter, tt.kind, tt.reason, tt.retryAfter)
			}
		})
	}
}

func TestErrorKeepsTheChain(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	err := fault.RetryableUntil(reasonUnknownOrder, fmt.Errorf("order 42: %w", base))
	if !errors.Is(err, base) {
		t.Errorf("errors.Is(%v, base) = false", err)
	}
	if got, want := err.Error(), "order 42: boom"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
