package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// AfterCommit registers action to run once the transaction of ctx has committed. ctx must be the
// context that Process, ProcessBatch or WithTx passed to the effect (or one derived from it).
//
// It is how an effect reports what it did — a log line, a notification to another component —
// without reporting work that is then rolled back: an effect's error, a failed commit, a batch
// rolled back because of one message and run again without it. Actions of a transaction that does
// not commit never run; those of one that commits run once, in the order registered, after the
// commit returned and before Process, ProcessBatch or WithTx does, with the caller's context. They
// must not block: the caller waits for them. An action that panics is logged and the others run.
//
// Work undone by rolling back to a savepoint does not take its actions with it: register them
// after the savepoint is released.
//
// AfterCommit reports false, and drops action, when ctx carries no transaction of this package:
// nothing can then tell whether, or when, the work commits.
func AfterCommit(ctx context.Context, action func(context.Context)) bool {
	actions, ok := ctx.Value(afterCommitKey{}).(*afterCommitActions)
	if !ok {
		return false
	}
	actions.mu.Lock()
	defer actions.mu.Unlock()
	actions.list = append(actions.list, action)
	return true
}

type afterCommitKey struct{}

// afterCommitActions are the actions registered in one transaction; an effect may register them
// from several goroutines.
type afterCommitActions struct {
	mu   sync.Mutex
	list []func(context.Context)
}

// withAfterCommit returns ctx carrying a new, empty list of actions for a transaction of its own,
// replacing any list of an enclosing transaction.
func withAfterCommit(ctx context.Context) (context.Context, *afterCommitActions) {
	actions := &afterCommitActions{}
	return context.WithValue(ctx, afterCommitKey{}, actions), actions
}

// run runs the actions once the transaction committed. A nil list has none.
func (a *afterCommitActions) run(ctx context.Context) {
	if a == nil {
		return
	}
	a.mu.Lock()
	list := a.list
	a.list = nil
	a.mu.Unlock()
	for _, action := range list {
		runAction(ctx, action)
	}
}

func runAction(ctx context.Context, action func(context.Context)) {
	defer func() {
		if r := recover(); r != nil {
			slog.Default().ErrorContext(ctx, "inbox: an after-commit action panicked; the transaction had committed",
				slog.String("panic", fmt.Sprint(r)))
		}
	}()
	action(ctx)
}
