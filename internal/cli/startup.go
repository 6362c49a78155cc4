package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// waitFor calls try until it succeeds or timeout passes, with a growing pause between attempts, and
// returns the last error. Each attempt gets the time that is left. An error wrapped in giveUp ends
// the wait at once.
func waitFor(ctx context.Context, timeout time.Duration, logger *slog.Logger, what string,
	try func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := try(ctx)
		if err == nil {
			return nil
		}
		if g, ok := errors.AsType[giveUp](err); ok {
			return g
		}
		if attempt == 1 {
			logger.InfoContext(ctx, "waiting for "+what, slog.String("err", err.Error()))
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// giveUp is an error that waiting will not cure.
type giveUp struct{ error }

// openDatabase connects to DATABASE_URL (search_path set to schema when not empty) and waits up to
// STARTUP_TIMEOUT for Postgres to answer.
func openDatabase(ctx context.Context, cfg *Config, logger *slog.Logger, schema string) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil { // checked with the configuration: only a race with the environment gets here
		return nil, &settingError{name: "DATABASE_URL",
			err: fmt.Errorf("invalid URL %q: %s", maskURL(cfg.DatabaseURL), parseConfigReason(err, cfg.DatabaseURL))}
	}
	if schema != "" {
		pcfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	pcfg.ConnConfig.Tracer = pgxTracer(logger, pcfg.ConnConfig.Password)
	pcfg.ConnConfig.ConnectTimeout = min(cmpOr(pcfg.ConnConfig.ConnectTimeout, 5*time.Second), cfg.StartupTimeout)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, &settingError{name: "DATABASE_URL", err: err}
	}
	scrub := secretScrubber(pcfg.ConnConfig.Password)
	err = waitFor(ctx, cfg.StartupTimeout, logger, "Postgres", func(ctx context.Context) error {
		return pool.Ping(ctx)
	})
	if err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &settingError{name: "DATABASE_URL", err: fmt.Errorf("Postgres at %s unreachable after %s: %s",
			maskURL(cfg.DatabaseURL), cfg.StartupTimeout, scrub(err.Error()))}
	}
	return pool, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// kafkaAuth returns the SASL mechanism and TLS configuration of the configuration, nil when unused.
func kafkaAuth(cfg *Config) (sasl.Mechanism, *tls.Config, error) {
	var tlsConfig *tls.Config
	if cfg.KafkaTLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	var (
		mechanism sasl.Mechanism
		err       error
	)
	switch cfg.KafkaSASLMechanism {
	case "PLAIN":
		mechanism = plain.Mechanism{Username: cfg.KafkaUsername, Password: cfg.KafkaPassword}
	case "SCRAM-SHA-256":
		mechanism, err = scram.Mechanism(scram.SHA256, cfg.KafkaUsername, cfg.KafkaPassword)
	case "SCRAM-SHA-512":
		mechanism, err = scram.Mechanism(scram.SHA512, cfg.KafkaUsername, cfg.KafkaPassword)
	}
	if err != nil {
		return nil, nil, &settingError{name: "KAFKA_SASL_MECHANISM", err: err}
	}
	return mechanism, tlsConfig, nil
}

// kafkaAdmin is a kafka-go client for the checks the worker makes at start. Close it when done.
type kafkaAdmin struct {
	client    *kafka.Client
	transport *kafka.Transport
}

func newKafkaAdmin(cfg *Config) (*kafkaAdmin, error) {
	mechanism, tlsConfig, err := kafkaAuth(cfg)
	if err != nil {
		return nil, err
	}
	transport := &kafka.Transport{SASL: mechanism, TLS: tlsConfig, ClientID: "inboxworker-admin"}
	return &kafkaAdmin{
		client:    &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Transport: transport, Timeout: 10 * time.Second},
		transport: transport,
	}, nil
}

func (k *kafkaAdmin) Close() { k.transport.CloseIdleConnections() }

// checkKafka waits up to STARTUP_TIMEOUT for the brokers to answer, then warns about each topic that
// does not exist, and settles the inbox retentions against the topics' (settleRetention).
func checkKafka(ctx context.Context, cfg *Config, logger *slog.Logger) error {
	admin, err := newKafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	topics := []string{cfg.TopicPayments, cfg.TopicSMS}
	meta, err := waitForKafka(ctx, cfg, logger, admin, topics)
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, t := range meta.Topics {
		if t.Error == nil {
			present[t.Name] = true
		}
	}
	var existing []string
	for _, t := range topics {
		if present[t] {
			existing = append(existing, t)
			continue
		}
		logger.WarnContext(ctx, "topic does not exist (yet): the worker consumes it once it is created",
			slog.String("topic", t))
	}
	settleRetention(ctx, cfg, logger, admin, existing)
	return nil
}

// waitForKafka waits up to STARTUP_TIMEOUT for the brokers to answer a metadata request for topics
// and returns the answer. Refused credentials end the wait at once. Its errors name the setting.
func waitForKafka(ctx context.Context, cfg *Config, logger *slog.Logger, admin *kafkaAdmin,
	topics []string) (*kafka.MetadataResponse, error) {
	var meta *kafka.MetadataResponse
	hungUp := false // by any attempt: the last one may only have run out of time
	err := waitFor(ctx, cfg.StartupTimeout, logger, "Kafka", func(ctx context.Context) error {
		var err error
		meta, err = admin.client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if errors.Is(err, kafka.SASLAuthenticationFailed) || errors.Is(err, kafka.UnsupportedSASLMechanism) {
			return giveUp{err}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			hungUp = true
		}
		return err
	})
	if g, ok := errors.AsType[giveUp](err); ok {
		return nil, &settingError{name: "KAFKA_USERNAME", err: fmt.Errorf("Kafka at %s refused the credentials (%s %s): %s",
			strings.Join(cfg.KafkaBrokers, ","), cfg.KafkaSASLMechanism, cfg.KafkaUsername,
			secretScrubber(cfg.KafkaPassword)(g.Error()))}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var hint string
		if hungUp {
			// A broker that does not like a client's TLS or SASL often just hangs up.
			hint = " (the brokers hung up: check KAFKA_TLS, KAFKA_SASL_MECHANISM, KAFKA_USERNAME and KAFKA_PASSWORD)"
		}
		return nil, &settingError{name: "KAFKA_BROKERS", err: fmt.Errorf("Kafka at %s unreachable after %s: %s%s",
			strings.Join(cfg.KafkaBrokers, ","), cfg.StartupTimeout, secretScrubber(cfg.KafkaPassword)(err.Error()), hint)}
	}
	return meta, nil
}

const retentionWarning = "inbox retention is shorter than the topic's retention"

// Kafka's defaults for a topic (log.retention.hours = 168, log.roll.hours = 168), assumed for a
// topic whose configuration cannot be read: one created later gets them unless told otherwise.
const (
	kafkaDefaultRetention = 7 * 24 * time.Hour
	kafkaDefaultSegment   = 7 * 24 * time.Hour
)

// retentionMargin covers what the topic's settings do not: the broker deletes expired segments on
// a timer (log.retention.check.interval.ms, 5 minutes by default), and clocks differ.
const retentionMargin = time.Hour

// foreverRetention is the default inbox retention for a topic that keeps messages forever
// (retention.ms = -1). No finite retention is long enough there; keeping every key forever would
// grow the inbox without bound. 30 days covers any redelivery but a reset of the group to the
// earliest offset, which a warning at start names.
const foreverRetention = 30 * 24 * time.Hour

// topicRetention is how long a topic can hand out a message: Kafka deletes a segment only once its
// newest message is older than retention.ms, and a segment takes new messages for up to segment.ms,
// so a message can be read up to retention.ms + segment.ms after it was written.
type topicRetention struct {
	retention, segment time.Duration
	forever            bool // retention.ms = -1 (or beyond a century)
}

func (t topicRetention) readable() time.Duration { return t.retention + t.segment }

func (t topicRetention) retentionText() string {
	if t.forever {
		return "forever"
	}
	return t.retention.String()
}

// settleRetention makes each inbox remember keys at least as long as its topic can redeliver their
// messages: a message Kafka hands out again after its key was purged (a consumer group reset to the
// earliest offset, say) would be applied twice. An unset INBOX_RETENTION_* becomes the topic's
// retention.ms + segment.ms + retentionMargin, read now; for a topic that keeps messages forever,
// foreverRetention with a warning; for a topic whose configuration cannot be read (not created yet,
// or no permission to describe it), what Kafka's defaults would give, with a warning. A setting
// given explicitly wins, with a warning when it is shorter than what the topic can redeliver.
// Each topic gets one info line saying which retention its inbox uses and why.
func settleRetention(ctx context.Context, cfg *Config, logger *slog.Logger, admin *kafkaAdmin, existing []string) {
	read := readTopicRetention(ctx, logger, admin, existing)
	for _, r := range []struct {
		topic, setting string
		d              *time.Duration
	}{
		{cfg.TopicPayments, "INBOX_RETENTION_PAYMENTS", &cfg.InboxRetentionPayments},
		{cfg.TopicSMS, "INBOX_RETENTION_SMS", &cfg.InboxRetentionSMS},
	} {
		topic, known := read[r.topic]
		source := "topic"
		if !known {
			topic, source = topicRetention{retention: kafkaDefaultRetention, segment: kafkaDefaultSegment}, "kafka defaults"
		}
		switch {
		case *r.d != 0:
			source = "setting"
		case topic.forever:
			*r.d = foreverRetention
		default:
			*r.d = topic.readable() + retentionMargin
		}
		attrs := []any{slog.String("topic", r.topic), slog.String("setting", r.setting),
			slog.String("inbox_retention", r.d.String()), slog.String("topic_retention", topic.retentionText()),
			slog.String("segment", topic.segment.String()), slog.String("source", source)}
		logger.InfoContext(ctx, "inbox retention", attrs...)
		if known && (topic.forever || *r.d < topic.readable()) {
			fix := "raise " + r.setting + " to at least the topic's retention.ms + segment.ms, or lower them"
			if topic.forever {
				fix = "set a retention.ms on the topic; until then, never reset the group to the earliest offset"
			}
			logger.WarnContext(ctx, retentionWarning, append(attrs,
				slog.String("why", "a message Kafka redelivers after its key is purged would be applied again; "+fix))...)
		}
	}
}

// readTopicRetention returns the retention of each of topics whose configuration could be read.
func readTopicRetention(ctx context.Context, logger *slog.Logger, admin *kafkaAdmin, topics []string) map[string]topicRetention {
	out := map[string]topicRetention{}
	if len(topics) == 0 {
		return out
	}
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms", "segment.ms"}})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := admin.client.DescribeConfigs(ctx, req)
	if err != nil {
		logger.WarnContext(ctx, "could not read the topics' retention.ms; assuming Kafka's defaults",
			slog.String("err", err.Error()))
		return out
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			logger.WarnContext(ctx, "could not read the topic's retention.ms; assuming Kafka's defaults",
				slog.String("topic", r.ResourceName), slog.String("err", r.Error.Error()))
			continue
		}
		t := topicRetention{segment: kafkaDefaultSegment}
		found := false
		for _, e := range r.ConfigEntries {
			d, forever, err := parseMillis(e.ConfigValue)
			if err != nil {
				continue
			}
			switch e.ConfigName {
			case "retention.ms":
				t.retention, t.forever, found = d, forever, true
			case "segment.ms":
				if !forever {
					t.segment = d
				}
			}
		}
		if !found {
			logger.WarnContext(ctx, "the topic's configuration has no retention.ms; assuming Kafka's defaults",
				slog.String("topic", r.ResourceName))
			continue
		}
		out[r.ResourceName] = t
	}
	return out
}

// parseMillis parses a Kafka duration in milliseconds; -1, or more than a century, is forever.
func parseMillis(v string) (d time.Duration, forever bool, err error) {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, err
	}
	const century = 100 * 365 * 24 * time.Hour
	if ms < 0 || ms > century.Milliseconds() {
		return 0, true, nil
	}
	return time.Duration(ms) * time.Millisecond, false, nil
}
