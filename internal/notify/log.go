package notify

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
)

// LogSender sends nothing and accepts every SMS. It stands in for a provider in development and where
// SMS_PROVIDER_URL is unset.
//
// It does not log each SMS: the handler logs the one line of each SMS it records, with the number
// masked, the params' values left out and the "log-" id that tells it was not sent. A line from the
// sender as well would say "not sent" and "sent" of one message, and would be written inside a
// transaction that may still roll back. The sender logs once, at its first SMS, that SMS are not sent.
type LogSender struct {
	logger *slog.Logger
	once   sync.Once
}

// NewLogSender returns a LogSender that logs to logger, or to slog.Default() when logger is nil.
func NewLogSender(logger *slog.Logger) *LogSender {
	return &LogSender{logger: cmp.Or(logger, slog.Default())}
}

// Send returns "log-" and the start of the SHA-256 of sms.Key as the message id: like a provider that
// honours idempotency keys, it gives one key one id.
func (s *LogSender) Send(ctx context.Context, sms SMS) (string, error) {
	s.once.Do(func() {
		s.logger.WarnContext(ctx, "no SMS provider configured: SMS are recorded with a log- id and not sent")
	})
	sum := sha256.Sum256([]byte(sms.Key))
	return "log-" + hex.EncodeToString(sum[:8]), nil
}
