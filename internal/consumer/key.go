package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/fault"
)

// The idempotency key's sources, in order of precedence. Header names match case-insensitively.
const (
	keyHeader         = "Idempotency-Key"
	fallbackKeyHeader = "X-Idempotent-Key"
	keyField          = "event_id"
	maxKeyLength      = 255 // characters
)

// IdempotencyKey returns m's idempotency key: the header Idempotency-Key, else the header
// X-Idempotent-Key, else the string field event_id of the JSON object in the value. The first
// source present decides; a key must be 1 to 255 printable characters: valid UTF-8 without control
// characters. When there is no valid key it returns the reason to dead-letter with.
func IdempotencyKey(m kafka.Message) (string, fault.Reason, error) {
	for _, name := range []string{keyHeader, fallbackKeyHeader} {
		for _, h := range m.Headers {
			if strings.EqualFold(h.Key, name) {
				return checkKey(string(h.Value), "header "+name)
			}
		}
	}
	var body struct {
		EventID json.RawMessage `json:"event_id"`
	}
	if json.Unmarshal(m.Value, &body) != nil || body.EventID == nil || bytes.Equal(body.EventID, []byte("null")) {
		return "", fault.MissingIdempotencyKey,
			errors.New("no idempotency key: no header Idempotency-Key or X-Idempotent-Key, no JSON field event_id")
	}
	var key string
	if err := json.Unmarshal(body.EventID, &key); err != nil {
		return "", fault.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key: JSON field %s is not a string", keyField)
	}
	return checkKey(key, "JSON field "+keyField)
}

func checkKey(key, source string) (string, fault.Reason, error) {
	invalid := func(why string) (string, fault.Reason, error) {
		return "", fault.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key in %s: %s", source, why)
	}
	switch n := utf8.RuneCountInString(key); {
	case !utf8.ValidString(key):
		return invalid("not valid UTF-8")
	case n == 0:
		return invalid("empty")
	case n > maxKeyLength:
		return invalid(fmt.Sprintf("%d characters, more than %d", n, maxKeyLength))
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return invalid("contains a control character")
	}
	return key, "", nil
}
