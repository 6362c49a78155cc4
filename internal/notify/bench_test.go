package notify_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// BenchmarkSend is one SMS through its three steps (lease and Check, a send that costs nothing,
// completion), each to its own number, one after another: what Postgres costs an SMS, without
// limits and with SMS_RECIPIENT_LIMIT's three windows (none of them full).
func BenchmarkSend(b *testing.B) {
	for _, bb := range []struct {
		name   string
		limits string
	}{{"Unlimited", ""}, {"RecipientLimit", "verify_code=1/1m;5/1h;10/24h"}} {
		b.Run(bb.name, func(b *testing.B) {
			db := pgtest.Schema(b)
			store, err := inbox.NewStore(db.Pool, inbox.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			limits, err := notify.ParseRecipientLimits(bb.limits)
			if err != nil {
				b.Fatal(err)
			}
			h, err := notify.NewHandler(notify.Config{Sender: notify.NewLogSender(),
				RecipientLimits: limits, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				key := fmt.Sprintf("k%d", i)
				d := inbox.Delivery{Key: key, Value: smsEvent(fmt.Sprintf("+86138%08d", i), "verify_code", ""), Attempt: 1,
					Produced: time.Now()}
				msg := inbox.Message{Handler: "sms", Key: key, Fingerprint: inbox.Fingerprint(d.Value), Topic: "notifications.sms"}
				if outcome, err := store.ProcessCall(context.Background(), msg, callOf(h, d)); err != nil || outcome != inbox.Applied {
					b.Fatalf("ProcessCall = %q, %v", outcome, err)
				}
			}
		})
	}
}
