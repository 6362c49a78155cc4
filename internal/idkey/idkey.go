// Package idkey finds a Kafka message's idempotency key by the rule of the worker's contract, and
// says what a key may be. It is the one place of that rule: the consumer takes every message's key
// through it, and the tools that read dead letters and the park (inspect, replay) take theirs too.
package idkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/jsonobject"
)

// The idempotency key's sources, in order of precedence. Header names match case-insensitively;
// the JSON member's name matches exactly, as JSON names do.
const (
	keyHeader         = "Idempotency-Key"
	fallbackKeyHeader = "X-Idempotent-Key"
	webhookKeyHeader  = "webhook-id" // a signed callback's (Standard Webhooks)
	keyField          = "event_id"
	maxKeyLength      = 255 // characters
)

// The errors of a message with no idempotency key in any source: its value is not JSON (reason
// InvalidPayload), is JSON but not an object, or is an object without event_id.
var (
	errTombstone = errors.New("empty value (tombstone): nothing to apply")
	errNotJSON   = errors.New("not valid JSON (and no header Idempotency-Key, X-Idempotent-Key or webhook-id to take the idempotency key from)")
	errNotObject = errors.New("no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, and the value is not a JSON object")
	errNoKey     = errors.New("no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, no JSON field event_id")
)

// Of returns m's idempotency key: the header Idempotency-Key, else the header
// X-Idempotent-Key, else the header webhook-id (a signed callback's id, which its provider keeps
// when it sends the callback again), else the string member named exactly event_id of the JSON
// object in the value.
// The first source present decides; an empty header counts as absent. A key must be 1 to 255
// characters a person can read and tell apart: valid UTF-8, no control or format characters (U+200B,
// U+FEFF, …), no white space but the ASCII space, and that not at either end. A source given twice
// (two headers of one name, two event_id members) must give one key: two readers of the message would
// otherwise take different ones. In the JSON value, a \u escape of an unpaired UTF-16 surrogate is
// refused rather than read as U+FFFD, so a U+FFFD in a key is always one the producer wrote. When
// there is no valid key it returns the reason to dead-letter with: InvalidPayload for a value that
// is not valid JSON and has no key header, as nothing could be read from it, and for an empty value
// (a tombstone: a delete marker of a compacted topic, never an event to apply), whatever its headers.
func Of(m kafka.Message) (string, inboxtype.Reason, error) {
	if len(m.Value) == 0 {
		return "", inboxtype.InvalidPayload, errTombstone
	}
	for _, name := range [...]string{keyHeader, fallbackKeyHeader, webhookKeyHeader} {
		key, err := headerKey(m.Headers, name)
		if err != nil {
			return "", inboxtype.InvalidIdempotencyKey, err
		}
		if key != "" {
			return Check(key, "header "+name)
		}
	}
	values, err := eventIDs(m.Value)
	switch {
	case errors.Is(err, errNotJSON):
		return "", inboxtype.InvalidPayload, err
	case err != nil:
		return "", inboxtype.MissingIdempotencyKey, err
	case values == nil:
		return "", inboxtype.MissingIdempotencyKey, errNoKey
	}
	for _, v := range values[1:] {
		if !bytes.Equal(v, values[0]) && !sameJSONString(v, values[0]) {
			return "", inboxtype.InvalidIdempotencyKey,
				fmt.Errorf("invalid idempotency key: JSON field %s appears %d times with different values", keyField, len(values))
		}
	}
	return fieldKey(values[0])
}

// headerKey returns the value of the headers named name (case-insensitively), "" when none has a
// value; headers of the name with different values are an error.
func headerKey(headers []kafka.Header, name string) (string, error) {
	var key string
	for _, h := range headers {
		if len(h.Value) == 0 || !strings.EqualFold(h.Key, name) {
			continue
		}
		if key != "" && key != string(h.Value) {
			return "", fmt.Errorf("invalid idempotency key: header %s appears twice with different values", name)
		}
		key = string(h.Value)
	}
	return key, nil
}

// fieldKey returns the idempotency key of raw, the JSON value of the member event_id.
func fieldKey(raw []byte) (string, inboxtype.Reason, error) {
	switch {
	case bytes.Equal(raw, []byte("null")):
		return "", inboxtype.MissingIdempotencyKey, errNoKey
	case raw[0] != '"':
		return "", inboxtype.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key: JSON field %s is not a string", keyField)
	case !utf8.Valid(raw):
		// encoding/json would read each invalid byte as U+FFFD: different keys would be one.
		return "", inboxtype.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key in JSON field %s: not valid UTF-8", keyField)
	case hasLoneSurrogate(raw):
		return "", inboxtype.InvalidIdempotencyKey,
			fmt.Errorf("invalid idempotency key in JSON field %s: a \\u escape of an unpaired UTF-16 surrogate", keyField)
	}
	key, err := jsonobject.Unquote(raw)
	if err != nil {
		return "", inboxtype.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key: JSON field %s is not a string", keyField)
	}
	return Check(key, "JSON field "+keyField)
}

// eventIDs returns the raw values of every top-level member of the JSON object value whose name is
// exactly keyField, in order. Its error is errNotJSON (with reason InvalidPayload) or errNotObject
// (MissingIdempotencyKey) for a value that is not one JSON object.
func eventIDs(value []byte) (values [][]byte, err error) {
	obj, err := jsonobject.Parse(value)
	if err != nil {
		if !json.Valid(value) { // on the error path only: Parse has checked a valid object
			return nil, errNotJSON
		}
		return nil, errNotObject
	}
	for m := range obj.Members() {
		if m.Is(keyField) {
			values = append(values, m.Value)
		}
	}
	return values, nil
}

// sameJSONString reports whether a and b are JSON strings of the same text written differently
// ("e" and "\u0065").
func sameJSONString(a, b []byte) bool {
	var sa, sb string
	return a[0] == '"' && b[0] == '"' && utf8.Valid(a) && utf8.Valid(b) && !hasLoneSurrogate(a) &&
		!hasLoneSurrogate(b) && json.Unmarshal(a, &sa) == nil && json.Unmarshal(b, &sb) == nil && sa == sb
}

// hasLoneSurrogate reports whether the JSON string raw holds a \u escape of a UTF-16 surrogate that
// is not part of a high-low pair.
func hasLoneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if i >= len(raw) || raw[i] != 'u' {
			continue
		}
		u, ok := hex4(raw, i+1)
		if !ok {
			return false // not valid JSON; the decoder refuses it
		}
		i += 4
		switch {
		case 0xDC00 <= u && u <= 0xDFFF:
			return true
		case 0xD800 <= u && u <= 0xDBFF:
			if !lowSurrogateAt(raw, i+1) {
				return true
			}
			i += 6
		}
	}
	return false
}

// lowSurrogateAt reports whether raw[i:] starts with a \\u escape of a low surrogate.
func lowSurrogateAt(raw []byte, i int) bool {
	if i+1 >= len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
		return false
	}
	low, ok := hex4(raw, i+2)
	return ok && 0xDC00 <= low && low <= 0xDFFF
}

// hex4 reads the four hex digits at raw[i:].
func hex4(raw []byte, i int) (rune, bool) {
	if i+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// CheckKey returns key if it is a valid idempotency key (see Of), else
// InvalidIdempotencyKey and why not, naming source, where key was found.
func Check(key, source string) (string, inboxtype.Reason, error) {
	invalid := func(why string) (string, inboxtype.Reason, error) {
		return "", inboxtype.InvalidIdempotencyKey, fmt.Errorf("invalid idempotency key in %s: %s", source, why)
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
	case strings.IndexFunc(key, isFormat) >= 0:
		return invalid("contains an invisible format character (such as U+200B or U+FEFF)")
	case strings.IndexFunc(key, isOtherSpace) >= 0:
		return invalid("contains white space other than the ASCII space")
	case key[0] == ' ' || key[len(key)-1] == ' ':
		return invalid("begins or ends with a space")
	}
	return key, "", nil
}

// isFormat reports whether r is an invisible format character (Unicode category Cf).
func isFormat(r rune) bool { return unicode.Is(unicode.Cf, r) }

// isOtherSpace reports whether r is white space that looks like a space, or like nothing, but is
// not the ASCII space: no-break, ideographic, line and paragraph separators.
func isOtherSpace(r rune) bool { return r != ' ' && unicode.IsSpace(r) }
