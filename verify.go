package inboxworker

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
)

// Verifier checks that a message comes from whom it says, before anything of it is recorded: a
// payment provider's signature over a callback, say. A route with one (Route.Verify) verifies each
// message as it is read; one that does not verify is dead-lettered with reason BadSignature and its
// error, never retried, and writes no inbox row.
type Verifier interface {
	// Verify returns the name of the key that verified m, which the message's handler sees
	// (Delivery.VerifiedBy) and may record with its effect, or an error wrapping one of
	// ErrUnsigned, ErrSignatureMalformed, ErrSignatureTimestamp and ErrNoKeyMatched, which
	// inboxworker_signature_failures_total counts it under (an error wrapping none counts as
	// ErrNoKeyMatched).
	//
	// Its verdict depends on m alone, never on the clock: a message redelivered after a crash,
	// or replayed from the dead-letter topic, verifies as it did when it first arrived. A
	// signature's age is measured against m.Produced, when the receiver produced the message.
	Verify(m Received) (keyName string, err error)
}

// Received is a message as a Verifier sees it: its value and headers as received, and its record's
// timestamp.
type Received struct {
	Value   []byte
	Headers []Header
	// Produced is the record's timestamp (CreateTime, unless the topic is set to LogAppendTime);
	// zero when the record has none. worker replay gives a message back its original timestamp.
	Produced time.Time
}

// Header is one Kafka header of a message. Names are as the producer wrote them: a verifier
// matches them in any case, as HTTP header names are.
type Header struct {
	Key   string
	Value []byte
}

// BadSignature is the dead-letter reason of a message its route's Verifier refused.
const BadSignature = inboxtype.BadSignature

// The problems of a message that does not verify, which a Verifier's error wraps.
var (
	// ErrUnsigned: the message carries no signature at all.
	ErrUnsigned = fault.ErrUnsigned
	// ErrSignatureMalformed: a signature header is missing, repeated or unreadable.
	ErrSignatureMalformed = fault.ErrSignatureMalformed
	// ErrSignatureTimestamp: the signature was made too long before, or after, the message was
	// produced.
	ErrSignatureTimestamp = fault.ErrSignatureTimestamp
	// ErrNoKeyMatched: no signature of the message matches any key.
	ErrNoKeyMatched = fault.ErrNoKeyMatched
)

// verifyFunc is v as the consumer calls it, on a Kafka message, a panic an error.
func verifyFunc(v Verifier) func(kafka.Message) (string, error) {
	return func(m kafka.Message) (string, error) {
		return unpanic("Verifier", func() (string, error) { return v.Verify(received(m)) })
	}
}

// received is m as a Verifier and a Route.Key see it.
func received(m kafka.Message) Received {
	headers := make([]Header, len(m.Headers))
	for i, h := range m.Headers {
		headers[i] = Header(h)
	}
	return Received{Value: m.Value, Headers: headers, Produced: m.Time}
}

// message is r as a Kafka message.
func (r Received) message() kafka.Message {
	headers := make([]kafka.Header, len(r.Headers))
	for i, h := range r.Headers {
		headers[i] = kafka.Header(h)
	}
	return kafka.Message{Value: r.Value, Headers: headers, Time: r.Produced}
}

// errPanic is the error of a team's function that panicked on a message.
var errPanic = errors.New("panicked")

// unpanic returns f(), or an error wrapping errPanic when f panics: a team's function that panics
// on a message dead-letters the message, and the worker goes on.
func unpanic(what string, f func() (string, error)) (s string, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = "", fault.Permanent(inboxtype.HandlerError, fmt.Errorf("%s %w: %v", what, errPanic, v))
		}
	}()
	return f()
}
