package notify

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
)

// LogSender sends nothing: it logs each SMS, the number masked and the params' values left out, and
// accepts it. It stands in for a provider in development and where SMS_PROVIDER_URL is unset.
type LogSender struct {
	logger *slog.Logger
}

// NewLogSender returns a LogSender that logs to logger, or to slog.Default() when logger is nil.
func NewLogSender(logger *slog.Logger) *LogSender {
	return &LogSender{logger: cmp.Or(logger, slog.Default())}
}

// Send logs sms and returns "log-" and the start of the SHA-256 of its key as the message id: like a
// provider that honours idempotency keys, it gives one key one id.
func (s *LogSender) Send(ctx context.Context, sms SMS) (string, error) {
	sum := sha256.Sum256([]byte(sms.Key))
	id := "log-" + hex.EncodeToString(sum[:8])
	s.logger.InfoContext(ctx, "sms not sent: no provider configured, logged only",
		slog.Any("sms", sms), slog.String("provider_message_id", id))
	return id, nil
}
