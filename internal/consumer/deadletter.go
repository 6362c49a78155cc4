package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
)

// newDeadLetterWriter returns the producer of dead letters. Writes are synchronous and acknowledged
// by all in-sync replicas, one message per request, so that a dead letter is durable before its
// offset is committed. kafka-go has no idempotent producer: a write retried after a lost
// acknowledgement, or after a crash before the commit, may store a dead letter twice; never none.
func (c *Consumer) newDeadLetterWriter() *kafka.Writer {
	w := deadletter.NewWriter(c.config.Brokers, c.transport)
	w.MaxAttempts = 3
	w.AllowAutoTopicCreation = true
	w.Logger = kafkaLogger(c.log, slog.LevelDebug)
	w.ErrorLogger = kafkaErrorLogger(c.log)
	return w
}

// deadLetter writes m to its topic's dead-letter topic, with the original key, value and headers
// and the dlq-* headers describing f (package deadletter). A message in the dead-letter topic left
// no inbox row, so replaying it later processes it normally.
//
// A write that fails for a reason that will pass (a broker or leader unavailable, a topic not
// created yet) is retried in place, without limit: the partition waits, and its offset stays
// uncommitted, as during a database outage. Stopping the partition instead would end the whole group
// generation (kafka-go ends a generation when any of its goroutines returns) and have the next owner
// meet the same unwritable dead-letter topic.
//
// A write the dead-letter topic refuses for good (see refused: too large for it, not authorised)
// would wait forever. The dead letter is kept in Postgres instead (storeDeadLetter), whence worker
// replay takes it, and the partition moves on.
//
// It returns an error only when ctx is done or the consumer begins to stop; the message is then
// delivered again. It changes nothing of p: several messages of one partition may be dead-lettered
// at once.
func (p *partition) deadLetter(ctx context.Context, m kafka.Message, f failure, log *slog.Logger) error {
	letter := deadletter.Letter{
		Reason:    f.reason,
		Error:     deadletter.ErrorText(f.err),
		Topic:     p.topic,
		Partition: p.id,
		Offset:    m.Offset,
		Attempts:  f.attempts,
		FailedAt:  time.Now(),
		Produced:  m.Time,
	}
	dlq := letter.Message(p.c.config.DLQSuffix, m)
	dlq.Headers = p.c.config.Tracer.Inject(ctx, dlq.Headers)
	var refusal error // why the topic refused it, for good
	err := p.retry(ctx, func(ctx context.Context) error {
		err := p.c.dlq.WriteMessages(ctx, dlq)
		if refused(err) {
			refusal = err
			return nil
		}
		return err
	}, func(err error, _ int, delay time.Duration) {
		log.ErrorContext(ctx, "cannot write the dead letter; the partition waits and tries again",
			"dlq_topic", dlq.Topic, "reason", f.reason, "delay", delay, "error", err)
	})
	switch {
	case err != nil:
		return err
	case refusal != nil:
		return p.storeDeadLetter(ctx, dlq, letter, refusal, log)
	}
	log.WarnContext(ctx, "dead-lettered the message", "dlq_topic", dlq.Topic, "reason", f.reason,
		"attempts", f.attempts, "error", f.err)
	return nil
}

// storeDeadLetter keeps dlq, the dead letter described by letter that its topic refused with
// writeErr, in the dead_letters table, in one statement. A failed insert is retried without limit,
// as the dead-letter write was: the database may be down, and the dead letter must not be lost. It
// returns an error only when ctx is done or the consumer begins to stop.
func (p *partition) storeDeadLetter(ctx context.Context, dlq kafka.Message, letter deadletter.Letter, writeErr error, log *slog.Logger) error {
	stored := deadletter.Stored{
		DLQTopic:   dlq.Topic,
		Letter:     letter,
		Key:        dlq.Key,
		Value:      dlq.Value,
		Headers:    dlq.Headers,
		WriteError: writeErr.Error(),
	}
	var id int64
	err := p.retry(ctx, func(ctx context.Context) error {
		save, cancel := context.WithTimeout(ctx, p.route.Timeout)
		defer cancel()
		var err error
		id, err = p.c.deadLetters.Save(save, stored)
		return err
	}, func(err error, _ int, delay time.Duration) {
		log.ErrorContext(ctx, "cannot store the dead letter its topic refused; the partition waits and tries again",
			"dlq_topic", dlq.Topic, "reason", letter.Reason, "delay", delay, "error", inbox.Classify(err))
	})
	if err != nil {
		return err
	}
	p.c.metrics.deadLetterStored(p.topic)
	log.ErrorContext(ctx, "the dead-letter topic refused the dead letter; kept it in the database table "+
		"dead_letters for worker replay", "dlq_topic", dlq.Topic, "dead_letters_id", id, "reason", letter.Reason,
		"attempts", letter.Attempts, "error", letter.Error, "write_error", writeErr)
	return nil
}

// refused reports whether a dead-letter write failed for a reason that retrying will not change,
// by kafka-go's error code: the record is too large for the topic, or for kafka-go's own limit
// (MessageTooLargeError, whose code is MessageSizeTooLarge), the broker finds it invalid, the topic
// name is invalid, or the worker is not authorised to write there. Anything else (a broker or
// leader not available, a connection lost, a topic not yet created) may pass, and is waited for.
func refused(err error) bool {
	var each kafka.WriteErrors
	if errors.As(err, &each) {
		for _, e := range each {
			if e != nil {
				err = e
				break
			}
		}
	}
	var code kafka.Error
	if !errors.As(err, &code) {
		return false
	}
	switch code {
	case kafka.MessageSizeTooLarge, kafka.RecordListTooLarge, kafka.InvalidRecord, kafka.InvalidTopic,
		kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed:
		return true
	}
	return false
}
