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
// does not exist and each inbox retention shorter than its topic's retention.
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
	checkRetention(ctx, cfg, logger, admin, existing)
	return nil
}

// waitForKafka waits up to STARTUP_TIMEOUT for the brokers to answer a metadata request for topics
// and returns the answer. Refused credentials end the wait at once. Its errors name the setting.
func waitForKafka(ctx context.Context, cfg *Config, logger *slog.Logger, admin *kafkaAdmin,
	topics []string) (*kafka.MetadataResponse, error) {
	var meta *kafka.MetadataResponse
	err := waitFor(ctx, cfg.StartupTimeout, logger, "Kafka", func(ctx context.Context) error {
		var err error
		meta, err = admin.client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if errors.Is(err, kafka.SASLAuthenticationFailed) || errors.Is(err, kafka.UnsupportedSASLMechanism) {
			return giveUp{err}
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
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// A broker that does not like a client's TLS or SASL often just hangs up.
			hint = " (the brokers hung up: check KAFKA_TLS, KAFKA_SASL_MECHANISM, KAFKA_USERNAME and KAFKA_PASSWORD)"
		}
		return nil, &settingError{name: "KAFKA_BROKERS", err: fmt.Errorf("Kafka at %s unreachable after %s: %s%s",
			strings.Join(cfg.KafkaBrokers, ","), cfg.StartupTimeout, secretScrubber(cfg.KafkaPassword)(err.Error()), hint)}
	}
	return meta, nil
}

const retentionWarning = "inbox retention is shorter than the topic's retention"

// checkRetention warns when an inbox forgets keys sooner than Kafka forgets messages: a message
// redelivered after its key was purged (a consumer group reset to the earliest offset, say) would
// be applied twice. A failure to read the topic configuration is logged and otherwise ignored.
func checkRetention(ctx context.Context, cfg *Config, logger *slog.Logger, admin *kafkaAdmin, topics []string) {
	if len(topics) == 0 {
		return
	}
	inboxRetention := map[string]struct {
		setting string
		d       time.Duration
	}{
		cfg.TopicPayments: {"INBOX_RETENTION_PAYMENTS", cfg.InboxRetentionPayments},
		cfg.TopicSMS:      {"INBOX_RETENTION_SMS", cfg.InboxRetentionSMS},
	}
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms"}})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := admin.client.DescribeConfigs(ctx, req)
	if err != nil {
		logger.WarnContext(ctx, "could not read the topics' retention.ms", slog.String("err", err.Error()))
		return
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			logger.WarnContext(ctx, "could not read the topic's retention.ms", slog.String("topic", r.ResourceName),
				slog.String("err", r.Error.Error()))
			continue
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName != "retention.ms" {
				continue
			}
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				continue
			}
			inbox := inboxRetention[r.ResourceName]
			topicRetention := time.Duration(ms) * time.Millisecond
			if ms >= 0 && inbox.d >= topicRetention {
				continue
			}
			kept := topicRetention.String()
			if ms < 0 {
				kept = "forever"
			}
			logger.WarnContext(ctx, retentionWarning,
				slog.String("topic", r.ResourceName), slog.String("topic_retention", kept),
				slog.String("setting", inbox.setting), slog.String("inbox_retention", inbox.d.String()),
				slog.String("why", "a message Kafka redelivers after its key is purged would be applied again; "+
					"raise "+inbox.setting+" to at least the topic's retention.ms, or lower retention.ms"))
		}
	}
}
