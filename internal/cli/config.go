package cli

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Config is the worker's configuration: every variable of the contract, read from the environment
// and overridden by its flag. Each field's default is its setting's, in the table settings.
type Config struct {
	KafkaBrokers        []string
	KafkaGroupID        string
	KafkaSessionTimeout time.Duration
	KafkaSASLMechanism  string // "", PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	KafkaUsername       string
	KafkaPassword       string
	KafkaTLS            bool

	DatabaseURL string

	TopicPayments string
	TopicSMS      string
	DLQSuffix     string

	SMSProviderURL   string
	SMSProviderToken string

	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration
	RetryMaxElapsed      time.Duration

	// InboxRetentionPayments and InboxRetentionSMS are how long idempotency keys are remembered.
	// Zero (the default) means "as long as the topic can redeliver": settled at start from the
	// topic's configuration (see checkKafka).
	InboxRetentionPayments time.Duration
	InboxRetentionSMS      time.Duration

	BatchSize int
	BatchWait time.Duration

	HTTPAddr        string
	ShutdownTimeout time.Duration
	StartupTimeout  time.Duration

	LogLevel  slog.Level
	LogFormat string // json or text

	DevKafkaAddr string

	// NoMigrate skips the migrations at start (worker run --no-migrate). A flag only.
	NoMigrate bool

	// used are the settings of the command being run, for the startup log line.
	used []*setting
	// explicit holds the env names of the settings given by flag or environment, not defaulted.
	explicit map[string]bool
	// shown holds each setting's value as the startup line shows it, by env name: the text it was
	// resolved from, masked by the setting's kind.
	shown map[string]string
}

// A use is a set of commands that read a setting.
type use uint

const (
	useRun use = 1 << iota
	useMigrate
	useDev
	useDemo
	useReplay

	// useWorker are the commands that run the consumer: its tuning applies to them.
	useWorker = useRun | useDev
	// useBrokers are the commands that reach the brokers of KAFKA_BROKERS, not an embedded one.
	useBrokers = useRun | useReplay
	// useDatabase are the commands that reach DATABASE_URL: all of them.
	useDatabase = useRun | useMigrate | useDev | useDemo | useReplay
	// useTopics are the commands that know the consumed topics.
	useTopics = useWorker | useDemo
)

// A kind says how the startup line shows a setting's value.
type kind int

const (
	plain  kind = iota
	secret      // never shown: "xxxxx" when set
	url         // shown with its passwords and query values masked
)

// settings are every configuration variable, in the order --help and the startup log list them.
// Each entry is all there is to a setting: adding one is adding an entry (and its Config field).
var settings = []*setting{
	{env: "KAFKA_BROKERS", flag: "kafka-brokers", def: "127.0.0.1:9092", meta: "LIST", use: useBrokers,
		usage: "comma-separated bootstrap brokers (host:port)",
		set: func(c *Config, v string) (err error) {
			c.KafkaBrokers, err = parseAddrList(v)
			return err
		}},
	{env: "KAFKA_GROUP_ID", flag: "kafka-group-id", def: "inboxworker", meta: "NAME", use: useTopics,
		usage: "consumer group",
		set:   func(c *Config, v string) error { return parseNonEmpty(&c.KafkaGroupID, v) }},
	{env: "KAFKA_SESSION_TIMEOUT", flag: "kafka-session-timeout", def: "10s", meta: "DURATION", use: useWorker,
		usage: "how soon the group notices a dead worker and hands its partitions on",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.KafkaSessionTimeout, v) }},
	{env: "KAFKA_SASL_MECHANISM", flag: "kafka-sasl-mechanism", meta: "NAME", use: useBrokers,
		canonical: strings.ToUpper,
		usage:     "SASL mechanism for managed Kafka: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (unset: no SASL)",
		set: func(c *Config, v string) error {
			switch m := strings.ToUpper(v); m {
			case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
				c.KafkaSASLMechanism = m
				return nil
			}
			return fmt.Errorf("unknown mechanism %q (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", v)
		}},
	{env: "KAFKA_USERNAME", flag: "kafka-username", meta: "NAME", use: useBrokers,
		usage: "SASL user name",
		set:   func(c *Config, v string) error { c.KafkaUsername = v; return nil }},
	{env: "KAFKA_PASSWORD", flag: "kafka-password", meta: "SECRET", kind: secret, use: useBrokers,
		usage: "SASL password (never logged)",
		set:   func(c *Config, v string) error { c.KafkaPassword = v; return nil }},
	{env: "KAFKA_TLS", flag: "kafka-tls", def: "false", use: useBrokers,
		usage: "connect to the brokers over TLS",
		set:   func(c *Config, v string) error { return parseBool(&c.KafkaTLS, v) }},
	{env: "DATABASE_URL", flag: "database-url", meta: "URL", kind: url, use: useDatabase,
		def:   "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		usage: "Postgres holding the inbox and the business tables",
		set:   func(c *Config, v string) error { return parseDatabaseURL(&c.DatabaseURL, v) }},
	{env: "TOPIC_PAYMENTS", flag: "topic-payments", def: "payments.callbacks", meta: "TOPIC", use: useTopics,
		usage: "payment callback topic",
		set:   func(c *Config, v string) error { return parseTopic(&c.TopicPayments, v) }},
	{env: "TOPIC_SMS", flag: "topic-sms", def: "notifications.sms", meta: "TOPIC", use: useTopics,
		usage: "SMS event topic",
		set:   func(c *Config, v string) error { return parseTopic(&c.TopicSMS, v) }},
	{env: "DLQ_SUFFIX", flag: "dlq-suffix", def: ".dlq", meta: "SUFFIX", use: useTopics | useReplay,
		usage: "dead-letter topic = source topic + suffix",
		set:   func(c *Config, v string) error { return parseTopic(&c.DLQSuffix, v) }},
	{env: "SMS_PROVIDER_URL", flag: "sms-provider-url", meta: "URL", kind: url, use: useTopics,
		usage: "HTTP SMS gateway (unset: SMS are only logged, with a warning at start)",
		set:   func(c *Config, v string) error { c.SMSProviderURL = v; return nil }},
	{env: "SMS_PROVIDER_TOKEN", flag: "sms-provider-token", meta: "SECRET", kind: secret, use: useTopics,
		usage: "sent to the SMS gateway as Authorization: Bearer (never logged)",
		set:   func(c *Config, v string) error { c.SMSProviderToken = v; return nil }},
	{env: "RETRY_INITIAL_INTERVAL", flag: "retry-initial-interval", def: "200ms", meta: "DURATION", use: useWorker,
		usage: "first backoff of a retryable handler error (exponential, with jitter)",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryInitialInterval, v) }},
	{env: "RETRY_MAX_INTERVAL", flag: "retry-max-interval", def: "30s", meta: "DURATION", use: useWorker,
		usage: "longest backoff between two attempts",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryMaxInterval, v) }},
	{env: "RETRY_MAX_ELAPSED", flag: "retry-max-elapsed", def: "5m", meta: "DURATION", use: useWorker,
		usage: "retry budget of one message, after which it is dead-lettered",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryMaxElapsed, v) }},
	{env: "INBOX_RETENTION_PAYMENTS", flag: "inbox-retention-payments", meta: "DURATION", use: useWorker,
		canonical: settledFromTopic,
		usage: "how long a payment callback's idempotency key is remembered " +
			"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
		set: func(c *Config, v string) error { return parseOptionalDuration(&c.InboxRetentionPayments, v) }},
	{env: "INBOX_RETENTION_SMS", flag: "inbox-retention-sms", meta: "DURATION", use: useWorker,
		canonical: settledFromTopic,
		usage: "how long an SMS event's idempotency key is remembered " +
			"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
		set: func(c *Config, v string) error { return parseOptionalDuration(&c.InboxRetentionSMS, v) }},
	{env: "BATCH_SIZE", flag: "batch-size", def: "256", meta: "N", use: useWorker,
		usage: "most messages of one partition applied in one transaction (1: a transaction per message)",
		set:   func(c *Config, v string) error { return parseLimit(&c.BatchSize, v) }},
	{env: "BATCH_WAIT", flag: "batch-wait", def: "5ms", meta: "DURATION", use: useWorker,
		usage: "how long a batch waits for more messages after its first",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.BatchWait, v) }},
	{env: "HTTP_ADDR", flag: "http-addr", def: ":8080", meta: "ADDR", use: useWorker,
		usage: "address of /metrics, /healthz and /readyz",
		set:   func(c *Config, v string) error { return parseAddr(&c.HTTPAddr, v) }},
	{env: "SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "30s", meta: "DURATION", use: useWorker,
		usage: "on SIGTERM, how long in-flight messages may take to finish",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.ShutdownTimeout, v) }},
	{env: "STARTUP_TIMEOUT", flag: "startup-timeout", def: "15s", meta: "DURATION", use: useDatabase,
		usage: "how long to wait for Postgres and Kafka at start before giving up",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.StartupTimeout, v) }},
	{env: "LOG_LEVEL", flag: "log-level", def: "info", meta: "LEVEL", use: useDatabase,
		usage: "debug, info, warn or error",
		set: func(c *Config, v string) error {
			if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("invalid level %q (use debug, info, warn or error)", v)
			}
			return nil
		}},
	{env: "LOG_FORMAT", flag: "log-format", def: "json", meta: "FORMAT", use: useDatabase,
		usage: "json (one object per line) or text (for people)",
		set: func(c *Config, v string) error {
			switch v {
			case "json", "text":
				c.LogFormat = v
				return nil
			}
			return fmt.Errorf("invalid format %q (use json or text)", v)
		}},
	{env: "DEV_KAFKA_ADDR", flag: "dev-kafka-addr", def: "127.0.0.1:9092", meta: "ADDR", use: useDev | useDemo,
		usage: "where the embedded broker of worker dev and worker demo listens",
		set:   func(c *Config, v string) error { return parseAddr(&c.DevKafkaAddr, v) }},
	{flag: "no-migrate", def: "false", use: useRun,
		usage: "do not apply pending migrations at start",
		set:   func(c *Config, v string) error { return parseBool(&c.NoMigrate, v) }},
}

// settledFromTopic is how the startup line shows an inbox retention: unset ones are settled later,
// from the topic.
func settledFromTopic(v string) string { return cmp.Or(v, "from the topic") }

// check validates settings against one another, once each is parsed. name tells how to name a
// setting in an error.
func (c *Config) check(name func(env string) string) error {
	fail := func(env, format string, args ...any) error {
		return &settingError{name: name(env), err: fmt.Errorf(format, args...)}
	}
	switch {
	case c.KafkaSASLMechanism != "" && c.KafkaUsername == "":
		return fail("KAFKA_USERNAME", "required with KAFKA_SASL_MECHANISM %s", c.KafkaSASLMechanism)
	case c.KafkaSASLMechanism != "" && c.KafkaPassword == "":
		return fail("KAFKA_PASSWORD", "required with KAFKA_SASL_MECHANISM %s", c.KafkaSASLMechanism)
	case c.KafkaSASLMechanism == "" && (c.KafkaUsername != "" || c.KafkaPassword != ""):
		return fail("KAFKA_SASL_MECHANISM", "required when KAFKA_USERNAME or KAFKA_PASSWORD is set")
	case c.TopicPayments == c.TopicSMS:
		return fail("TOPIC_SMS", "must differ from TOPIC_PAYMENTS (both are %q)", c.TopicSMS)
	case c.RetryInitialInterval > c.RetryMaxInterval:
		return fail("RETRY_INITIAL_INTERVAL", "%s is longer than RETRY_MAX_INTERVAL %s",
			c.RetryInitialInterval, c.RetryMaxInterval)
	case c.SMSProviderToken != "" && c.SMSProviderURL == "":
		return fail("SMS_PROVIDER_TOKEN", "set without SMS_PROVIDER_URL")
	}
	// The provider's URL and token are checked by the sender itself, here rather than once the
	// connections are made.
	if _, se := providerSender(c); se != nil {
		se.name = name(se.name)
		return se
	}
	return nil
}

// startupAttrs are the startup line's configuration: the settings of the command, as shown.
func (c *Config) startupAttrs() []slog.Attr {
	var attrs []slog.Attr
	for _, s := range c.used {
		if s.env != "" {
			attrs = append(attrs, slog.String(s.env, c.shown[s.env]))
		}
	}
	return attrs
}
