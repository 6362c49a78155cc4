package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/effect"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// call runs d through h in the three steps of CallHandler. A panic in any of h's methods is a
// permanent error; the transaction it ran in rolls back and the lease is released.
func (p *partition) call(ctx context.Context, h effect.CallHandler, msg inbox.Message, d inbox.Delivery, log *slog.Logger) (inbox.Outcome, error) {
	return p.c.config.Store.ProcessCall(ctx, msg, callSteps(h, p.route.CallLease, d, log, nil))
}

// callSteps is h's three steps for d as the inbox runs them (see effect.CallHandler). first, when
// set, runs first in the completion's transaction (a parked message's removal from the park).
func callSteps(h effect.CallHandler, lease time.Duration, d inbox.Delivery, log *slog.Logger, first inbox.Effect) inbox.Call {
	return inbox.Call{
		Lease: lease,
		Check: func(ctx context.Context, tx pgx.Tx) (err error) {
			defer recoverHandler(ctx, log, &err)
			return h.Check(ctx, tx, d)
		},
		Run: func(ctx context.Context, attempt int) (_ inbox.Effect, err error) {
			defer recoverHandler(ctx, log, &err)
			d := d
			d.Attempt = attempt
			complete, err := h.Call(ctx, d)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, tx pgx.Tx) (err error) {
				defer recoverHandler(ctx, log, &err)
				if first != nil {
					if err := first(ctx, tx); err != nil {
						return err
					}
				}
				if complete == nil { // nothing to record but the key
					return nil
				}
				return complete(ctx, tx)
			}, nil
		},
	}
}

// recoverHandler makes a panic of a handler, deferred in its caller, the permanent error *err.
func recoverHandler(ctx context.Context, log *slog.Logger, err *error) {
	if r := recover(); r != nil {
		log.ErrorContext(ctx, "the handler panicked", "panic", r, "stack", string(debug.Stack()))
		*err = fault.Permanent(fault.HandlerError, fmt.Errorf("panic: %v", r))
	}
}

// isHandler reports whether h can be a Route's Handler.
func isHandler(h any) bool {
	switch h.(type) {
	case effect.Handler, effect.CallHandler:
		return true
	}
	return false
}
