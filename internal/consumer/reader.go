package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	kafkasasl "github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// The read path. A partition's records are read with franz-go's kgo, read_committed, as the Java
// client reads them: a record of a transaction its producer aborted is never handed over, a record
// of a transaction still open waits for its commit (the fetch stops at the last stable offset), and
// the markers a transactional producer writes after each transaction are never taken for messages.
// kafka-go cannot (segmentio/kafka-go#1332: its Reader hands over aborted records and markers as
// messages, and its IsolationLevel changes nothing), so kafka-go keeps the group membership and the
// dead-letter writer, and kgo reads (and commits: commitToBroker); its records become kafka.Message here,
// at the fetch boundary, so the rest of the pipeline and the public API are unchanged.

// record is what a partition's reader hands over: a message, or a transaction's marker, which is
// never handled but lets the commit move past it (so that a partition whose last record is a marker
// has no lag).
type record struct {
	msg    kafka.Message
	marker bool
	// rewind, alone, says that the records after it are of another log, at lower offsets (see
	// reposition.go): what the window holds is to be dropped.
	rewind bool
}

// reader reads one partition from an offset on, committed records only. It belongs to the
// partition's fetcher goroutine.
type reader struct {
	client    *kgo.Client
	topic     string
	partition int32
	records   []*kgo.Record // fetched and not handed over yet
	err       error         // the partition's error, handed over once records are
	// position is the next offset to read: after the last record handed over, else the offset the
	// reader started at; -1 for the first or the last offset, not known yet.
	position int64
}

// newReader returns a reader of topic's partition from offset: an offset, or kafka.FirstOffset or
// kafka.LastOffset. It connects lazily: an unreachable broker is a fetch error, not an error here.
func (c *Consumer) newReader(topic string, partition int, offset int64, log *slog.Logger) (*reader, error) {
	at := kgo.NewOffset().At(offset)
	switch offset {
	case kafka.FirstOffset:
		at = kgo.NewOffset().AtStart()
	case kafka.LastOffset:
		at = kgo.NewOffset().AtEnd()
	}
	opts := append(c.kgoOptions(log),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {int32(partition): at}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		// An offset out of the log is the partition's to decide on (see reposition), never skipped
		// in silence.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.FetchMaxWait(fetchMaxWait),
		// A fetch is decoded whole and kept until the window takes it, a few hundred records at a
		// time: 256 KiB a partition (kgo's default is 1 MiB) keeps the reader's memory near
		// kafka-go's, and a larger record still comes whole (KIP-74).
		kgo.FetchMaxPartitionBytes(fetchMaxBytes),
		kgo.FetchMaxBytes(fetchMaxBytes),
		// A fetch that failed is tried again after 100ms, doubling to 1s: a topic deleted and
		// created again is known after five (UNKNOWN_TOPIC_ID), in about 2.5s rather than kgo's
		// default 250ms doubling to 5s, about 12s.
		kgo.RetryBackoffFn(retryBackoff),
	)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("read %s/%d: %w", topic, partition, err)
	}
	return &reader{client: client, topic: topic, partition: int32(partition), position: max(offset, -1)}, nil
}

// kgoOptions are the options of the consumer's kgo clients: where the brokers are and how to
// connect to them.
func (c *Consumer) kgoOptions(log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.config.Brokers...),
		kgo.ClientID(c.config.ClientID),
		kgo.DialTimeout(10 * time.Second),
		kgo.WithLogger(kgoLogger(log)),
		kgo.DisableClientMetrics(), // the worker's metrics are its own (/metrics), not the broker's
	}
	if c.config.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.config.TLS))
	}
	if c.config.SASL != nil {
		opts = append(opts, kgo.SASL(saslMechanism{c.config.SASL}))
	}
	return opts
}

// next returns the partition's next record, waiting for one until ctx is done. An error is the
// partition's (an offset out of range, a topic deleted, not authorised), or ctx's.
func (r *reader) next(ctx context.Context) (record, error) {
	for len(r.records) == 0 {
		if err := r.err; err != nil {
			r.err = nil
			return record{}, err
		}
		fetches := r.client.PollRecords(ctx, 0)
		if err := ctx.Err(); err != nil {
			return record{}, err
		}
		fetches.EachError(func(_ string, _ int32, err error) {
			if r.err == nil {
				r.err = err // the first of the fetch's
			}
		})
		r.records = fetches.Records()
	}
	rec := r.records[0]
	r.records[0] = nil
	r.records = r.records[1:]
	r.position = rec.Offset + 1
	return record{msg: message(rec), marker: rec.Attrs.IsControl()}, nil
}

// fetchMaxBytes is the most bytes a reader's fetch asks for.
const fetchMaxBytes = 256 << 10

// retryBackoff is how long a reader waits before it tries again after fails failures in a row.
func retryBackoff(fails int) time.Duration {
	return min(100*time.Millisecond<<min(max(fails-1, 0), 4), time.Second)
}

// close closes the reader's connections.
func (r *reader) close() { r.client.Close() }

// message is rec as the rest of the pipeline takes it.
func message(rec *kgo.Record) kafka.Message {
	m := kafka.Message{
		Topic:     rec.Topic,
		Partition: int(rec.Partition),
		Offset:    rec.Offset,
		Key:       rec.Key,
		Value:     rec.Value,
		Time:      rec.Timestamp,
	}
	if len(rec.Headers) > 0 {
		m.Headers = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// saslMechanism is a kafka-go SASL mechanism (Config.SASL) as franz-go's clients take one.
type saslMechanism struct{ m kafkasasl.Mechanism }

func (s saslMechanism) Name() string { return s.m.Name() }

func (s saslMechanism) Authenticate(ctx context.Context, hostport string) (sasl.Session, []byte, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err == nil {
		n, _ := strconv.Atoi(port)
		ctx = kafkasasl.WithMetadata(ctx, &kafkasasl.Metadata{Host: host, Port: n})
	}
	machine, first, err := s.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return saslSession{ctx: ctx, machine: machine}, first, nil
}

type saslSession struct {
	ctx     context.Context
	machine kafkasasl.StateMachine
}

func (s saslSession) Challenge(challenge []byte) (bool, []byte, error) {
	return s.machine.Next(s.ctx, challenge)
}

// kgoLogger adapts slog to franz-go's Logger: its warnings and errors at warn, each message said
// once, then at most once a minute with how often since; the rest at debug.
func kgoLogger(log *slog.Logger) kgo.Logger {
	return &kgoLog{log: log.With("component", "franz-go"), said: &repeats{interval: repeatInterval}}
}

type kgoLog struct {
	log  *slog.Logger
	said *repeats
}

func (l *kgoLog) Level() kgo.LogLevel {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		return kgo.LogLevelDebug
	}
	return kgo.LogLevelWarn
}

func (l *kgoLog) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	ctx := context.Background()
	// franz-go's own attributes in a group of their own: its topic and partition are the
	// partition's, already on the logger, and a key twice in one record is refused by strict
	// log ingesters.
	attrs := []any{slog.Group("franz_go", keyvals...)}
	if level > kgo.LogLevelWarn {
		l.log.DebugContext(ctx, msg, attrs...)
		return
	}
	if ok, since := l.said.say(msg, time.Now()); ok {
		if since > 0 {
			attrs = append(attrs, "repeated", since)
		}
		l.log.WarnContext(ctx, msg, attrs...)
	}
}
