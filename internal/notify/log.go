package notify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// LogSender sends nothing and accepts every SMS. It stands in for a provider in development and where
// SMS_PROVIDER_URL is unset; the worker says so once, at its start.
//
// It logs nothing: the handler logs the one line of each SMS it records, with the number masked,
// the params' values left out and the "log-" id that tells it was not sent. A line from the sender
// as well would say "not sent" and "sent" of one message, and would be written inside a
// transaction that may still roll back.
type LogSender struct{}

// NewLogSender returns a LogSender.
func NewLogSender() *LogSender { return &LogSender{} }

// Send returns "log-" and the start of the SHA-256 of sms.Key as the message id: like a provider that
// honours idempotency keys, it gives one key one id.
func (s *LogSender) Send(_ context.Context, sms SMS) (string, error) {
	sum := sha256.Sum256([]byte(sms.Key))
	return "log-" + hex.EncodeToString(sum[:8]), nil
}
