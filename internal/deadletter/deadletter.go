// Package deadletter is the dead-letter contract, written once: the dlq-* headers a dead letter
// carries on top of the original message's (its reason, error, original topic, partition and
// offset, …), built and read back here for the consumer, worker replay, worker demo and the tests;
// and the Postgres table that keeps the dead letters a dead-letter topic refused for good (too large
// for it, not authorised), so that they block no partition and are not lost, until worker replay
// puts them back.
//
// It does not decide when a message is dead-lettered nor why: the consumer does, with the reason
// codes of package inboxtype, declared once there, where a handler author finds them, and classified
// by package fault. It writes nothing to Kafka (the consumer writes dead letters, worker replay
// puts them back, both with the producer NewWriter configures) and knows nothing of handlers or the
// inbox.
package deadletter

import (
	"bytes"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// The headers a dead letter carries on top of the original message's. Every header whose name
// begins with headerPrefix, in any case, is the dead-lettering's own: it is replaced when a message
// is dead-lettered again, and taken off when it is replayed.
const (
	headerPrefix = "dlq-"

	HeaderReason            = "dlq-reason"             // a inboxtype.Reason
	HeaderError             = "dlq-error"              // human text, at most MaxErrorLen bytes
	HeaderOriginalTopic     = "dlq-original-topic"     // where the message was consumed
	HeaderOriginalPartition = "dlq-original-partition" // decimal
	HeaderOriginalOffset    = "dlq-original-offset"    // decimal
	HeaderAttempts          = "dlq-attempts"           // how many times its handler was started
	HeaderFailedAt          = "dlq-failed-at"          // RFC 3339, UTC
	// HeaderOriginalTimestamp is the original record's timestamp (RFC 3339 in milliseconds, UTC),
	// which worker replay gives the message back: what it means (when the receiver produced a
	// signed callback, when an SMS was asked for) must not become the time of its replay.
	HeaderOriginalTimestamp = "dlq-original-timestamp"
)

// timestampFormat is HeaderOriginalTimestamp's: RFC 3339 to the millisecond, as Kafka keeps it.
const timestampFormat = "2006-01-02T15:04:05.000Z07:00"

// MaxErrorLen bounds the error text of a dead letter, in bytes: a handler's error may quote a whole
// payload.
const MaxErrorLen = 4096

// Letter is what a dead letter says of the message it carries: why it failed and where it came from.
type Letter struct {
	Reason    inboxtype.Reason
	Error     string // see ErrorText
	Topic     string // the original topic
	Partition int
	Offset    int64
	Attempts  int
	FailedAt  time.Time
	// Produced is the original record's timestamp; zero when it had none.
	Produced time.Time
}

// ErrorText is err's text as a dead letter carries it: cut to MaxErrorLen bytes without splitting a
// character; "" for nil.
func ErrorText(err error) string {
	if err == nil {
		return ""
	}
	return truncate(err.Error(), MaxErrorLen)
}

// isOwnHeader reports whether the header name is one of the dead-lettering's own (dlq-*, any case).
func isOwnHeader(name string) bool {
	return len(name) >= len(headerPrefix) && strings.EqualFold(name[:len(headerPrefix)], headerPrefix)
}

// Headers returns the headers of the dead letter of a message with headers original: those less any
// of an earlier dead-lettering, then l's.
func (l Letter) Headers(original []kafka.Header) []kafka.Header {
	headers := make([]kafka.Header, 0, len(original)+8)
	for _, h := range original {
		if !isOwnHeader(h.Key) {
			headers = append(headers, h)
		}
	}
	for _, h := range [...][2]string{
		{HeaderReason, string(l.Reason)},
		{HeaderError, l.Error},
		{HeaderOriginalTopic, l.Topic},
		{HeaderOriginalPartition, strconv.Itoa(l.Partition)},
		{HeaderOriginalOffset, strconv.FormatInt(l.Offset, 10)},
		{HeaderAttempts, strconv.Itoa(l.Attempts)},
		{HeaderFailedAt, l.FailedAt.UTC().Format(time.RFC3339)},
	} {
		headers = append(headers, kafka.Header{Key: h[0], Value: []byte(h[1])})
	}
	if !l.Produced.IsZero() {
		headers = append(headers, kafka.Header{Key: HeaderOriginalTimestamp,
			Value: []byte(l.Produced.UTC().Format(timestampFormat))})
	}
	return headers
}

// Message is the dead letter of m, the message l describes, for the dead-letter topic of l.Topic,
// named with suffix (DLQ_SUFFIX): m's key and value, and its headers with l's (see Letter.Headers).
// The consumer and worker parked build their dead letters here.
func (l Letter) Message(suffix string, m kafka.Message) kafka.Message {
	return kafka.Message{Topic: l.Topic + suffix, Key: m.Key, Value: m.Value, Headers: l.Headers(m.Headers)}
}

// Read reads a dead letter's headers back: the Letter they describe, and the original message's
// headers (copies, less the dlq-* ones), in order. Header names are matched in any case. A missing or
// malformed header leaves its field zero: a dead letter written by hand, or by an older worker, is
// still read.
func Read(headers []kafka.Header) (l Letter, original []kafka.Header) {
	for _, h := range headers {
		if !isOwnHeader(h.Key) {
			original = append(original, kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)})
			continue
		}
		v := string(h.Value)
		switch strings.ToLower(h.Key) {
		case HeaderReason:
			l.Reason = inboxtype.Reason(v)
		case HeaderError:
			l.Error = v
		case HeaderOriginalTopic:
			l.Topic = v
		case HeaderOriginalPartition:
			l.Partition, _ = strconv.Atoi(v)
		case HeaderOriginalOffset:
			l.Offset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderAttempts:
			l.Attempts, _ = strconv.Atoi(v)
		case HeaderFailedAt:
			l.FailedAt, _ = time.Parse(time.RFC3339, v)
		case HeaderOriginalTimestamp:
			l.Produced, _ = time.Parse(time.RFC3339, v)
		}
	}
	return l, original
}

// truncate cuts s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
