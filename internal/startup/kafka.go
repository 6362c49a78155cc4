package startup

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/inboxworker/inboxworker/internal/redact"
)

// Kafka is where the brokers are, how to authenticate, and how long to wait for them.
type Kafka struct {
	// Brokers are the bootstrap brokers (KAFKA_BROKERS). Required.
	Brokers []string
	// SASLMechanism is "" (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	SASLMechanism string
	Username      string
	Password      string
	// TLS connects over TLS 1.2 or later.
	TLS bool
	// Timeout is how long WaitReady waits for the brokers (STARTUP_TIMEOUT). Required there.
	Timeout time.Duration
	// Logger receives the wait and the warnings. Required.
	Logger *slog.Logger
}

// Auth returns the SASL mechanism and TLS configuration of k, nil when unused.
func (k Kafka) Auth() (sasl.Mechanism, *tls.Config, error) {
	var tlsConfig *tls.Config
	if k.TLS {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	var (
		mechanism sasl.Mechanism
		err       error
	)
	switch k.SASLMechanism {
	case "PLAIN":
		mechanism = plain.Mechanism{Username: k.Username, Password: k.Password}
	case "SCRAM-SHA-256":
		mechanism, err = scram.Mechanism(scram.SHA256, k.Username, k.Password)
	case "SCRAM-SHA-512":
		mechanism, err = scram.Mechanism(scram.SHA512, k.Username, k.Password)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("KAFKA_SASL_MECHANISM: %w", err)
	}
	return mechanism, tlsConfig, nil
}

// Admin is a kafka-go client for what the commands ask the brokers outside a consumer group:
// metadata, configurations, offsets, fetches. Close it when done.
type Admin struct {
	Client *kafka.Client
	// Transport is the client's, authenticated: a writer may share it.
	Transport *kafka.Transport
	k         Kafka
}

// NewAdmin returns an admin client of k's brokers. Nothing is connected until it is used.
func NewAdmin(k Kafka) (*Admin, error) {
	mechanism, tlsConfig, err := k.Auth()
	if err != nil {
		return nil, err
	}
	transport := &kafka.Transport{SASL: mechanism, TLS: tlsConfig, ClientID: "inboxworker-admin"}
	return &Admin{
		Client:    &kafka.Client{Addr: kafka.TCP(k.Brokers...), Transport: transport, Timeout: 10 * time.Second},
		Transport: transport,
		k:         k,
	}, nil
}

// Close closes the admin's connections.
func (a *Admin) Close() { a.Transport.CloseIdleConnections() }

// WaitReady waits up to the Kafka's Timeout for the brokers to answer a metadata request for topics
// and returns the answer. Refused credentials end the wait at once. Its errors name the setting.
func (a *Admin) WaitReady(ctx context.Context, topics []string) (*kafka.MetadataResponse, error) {
	k := a.k
	scrub := redact.Scrubber(k.Password)
	var meta *kafka.MetadataResponse
	hungUp := false // by any attempt: the last one may only have run out of time
	err := waitFor(ctx, k.Timeout, k.Logger, "Kafka", func(ctx context.Context) error {
		var err error
		meta, err = a.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if errors.Is(err, kafka.SASLAuthenticationFailed) || errors.Is(err, kafka.UnsupportedSASLMechanism) {
			return giveUp{err}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			hungUp = true
		}
		return err
	})
	if g, ok := errors.AsType[giveUp](err); ok {
		return nil, fmt.Errorf("KAFKA_USERNAME: Kafka at %s refused the credentials (%s %s): %s",
			strings.Join(k.Brokers, ","), k.SASLMechanism, k.Username, scrub(g.Error()))
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
		return nil, fmt.Errorf("KAFKA_BROKERS: Kafka at %s unreachable after %s: %s%s",
			strings.Join(k.Brokers, ","), k.Timeout, scrub(err.Error()), hint)
	}
	return meta, nil
}

// A Topic is a consumed topic and how long its inbox remembers keys, for CheckKafka.
type Topic struct {
	Name string
	// InboxRetention is how long its inbox remembers keys, as set; 0 when unset, for CheckKafka to
	// settle from the topic's configuration (see settleRetention).
	InboxRetention time.Duration
	// RetentionSetting names the setting of InboxRetention, for the logs.
	RetentionSetting string
}

// CheckKafka waits for the brokers (WaitReady), then warns about each topic that does not exist,
// and settles each topic's InboxRetention against the topic's configuration, in place.
func CheckKafka(ctx context.Context, k Kafka, topics []Topic) error {
	admin, err := NewAdmin(k)
	if err != nil {
		return err
	}
	defer admin.Close()
	names := make([]string, len(topics))
	for i, t := range topics {
		names[i] = t.Name
	}
	meta, err := admin.WaitReady(ctx, names)
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
	for _, t := range names {
		if present[t] {
			existing = append(existing, t)
			continue
		}
		k.Logger.WarnContext(ctx, "topic does not exist (yet): the worker consumes it once it is created",
			slog.String("topic", t))
	}
	admin.settleRetention(ctx, topics, existing)
	return nil
}

// MaxTopicName is the longest topic name Kafka accepts, in characters.
const MaxTopicName = 249

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// CheckTopicName accepts a name Kafka accepts for a topic (a dead-letter suffix follows the same
// rules): not "." nor "..", which Kafka refuses too.
func CheckTopicName(v string) error {
	if !topicName.MatchString(v) || len(v) > MaxTopicName || v == "." || v == ".." {
		return fmt.Errorf("invalid topic name %q (letters, digits, '.', '_' and '-', at most %d)", v, MaxTopicName)
	}
	return nil
}
