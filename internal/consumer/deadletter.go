package consumer

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
)

// The headers a dead letter carries on top of the original message's.
const (
	headerReason            = "dlq-reason"
	headerError             = "dlq-error"
	headerOriginalTopic     = "dlq-original-topic"
	headerOriginalPartition = "dlq-original-partition"
	headerOriginalOffset    = "dlq-original-offset"
	headerAttempts          = "dlq-attempts"
	headerFailedAt          = "dlq-failed-at"
)

// maxErrorHeader bounds the dlq-error header, in bytes.
const maxErrorHeader = 4096

// newDeadLetterWriter returns the producer of dead letters. Writes are synchronous and acknowledged
// by all in-sync replicas, one message per request, so that a dead letter is durable before its
// offset is committed. kafka-go has no idempotent producer: a write retried after a lost
// acknowledgement, or after a crash before the commit, may store a dead letter twice; never none.
func (c *Consumer) newDeadLetterWriter() *kafka.Writer {
	return &kafka.Writer{
		Addr:                   kafka.TCP(c.config.Brokers...),
		Transport:              c.transport,
		Balancer:               &kafka.Hash{}, // one key's dead letters stay in order
		RequiredAcks:           kafka.RequireAll,
		BatchSize:              1,
		BatchTimeout:           time.Millisecond,
		MaxAttempts:            3,
		AllowAutoTopicCreation: true,
		Logger:                 kafkaLogger(c.log, slog.LevelDebug),
		ErrorLogger:            kafkaLogger(c.log, slog.LevelWarn),
	}
}

// deadLetter writes m to its topic's dead-letter topic, with the original key, value and headers
// and the dlq-* headers describing f. A message in the dead-letter topic left no inbox row, so
// replaying it later processes it normally.
//
// A failed write is retried in place, without limit, until it succeeds: the partition waits, and its
// offset stays uncommitted, as during a database outage. Stopping the partition instead would end the
// whole group generation (kafka-go ends a generation when any of its goroutines returns) and have the
// next owner meet the same unwritable dead-letter topic. It returns an error only when ctx is done or
// the consumer begins to stop; the message is then delivered again.
func (p *partition) deadLetter(ctx context.Context, m kafka.Message, f failure, log *slog.Logger) error {
	m.Topic, m.Partition = p.topic, p.id
	dlq := kafka.Message{
		Topic:   p.topic + p.c.config.DLQSuffix,
		Key:     m.Key,
		Value:   m.Value,
		Headers: deadLetterHeaders(m, f, time.Now()),
	}
	bo := p.outageBackOff()
	for {
		err := p.c.dlq.WriteMessages(ctx, dlq)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		delay := bo.NextBackOff()
		log.ErrorContext(ctx, "cannot write the dead letter; the partition waits and tries again",
			"dlq_topic", dlq.Topic, "reason", f.reason, "delay", delay, "error", err)
		if err := p.sleep(ctx, delay); err != nil {
			return err
		}
	}
	log.WarnContext(ctx, "dead-lettered the message", "dlq_topic", dlq.Topic, "reason", f.reason,
		"attempts", f.attempts, "error", f.err)
	return nil
}

// deadLetterHeaders returns m's headers, less any dlq-* headers of an earlier dead-lettering, plus
// the dlq-* headers describing f.
func deadLetterHeaders(m kafka.Message, f failure, at time.Time) []kafka.Header {
	headers := make([]kafka.Header, 0, len(m.Headers)+7)
	for _, h := range m.Headers {
		if !strings.HasPrefix(strings.ToLower(h.Key), "dlq-") {
			headers = append(headers, h)
		}
	}
	errText := ""
	if f.err != nil {
		errText = truncate(f.err.Error(), maxErrorHeader)
	}
	for _, h := range [...][2]string{
		{headerReason, string(f.reason)},
		{headerError, errText},
		{headerOriginalTopic, m.Topic},
		{headerOriginalPartition, strconv.Itoa(m.Partition)},
		{headerOriginalOffset, strconv.FormatInt(m.Offset, 10)},
		{headerAttempts, strconv.Itoa(f.attempts)},
		{headerFailedAt, at.UTC().Format(time.RFC3339)},
	} {
		headers = append(headers, kafka.Header{Key: h[0], Value: []byte(h[1])})
	}
	return headers
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
