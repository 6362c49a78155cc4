package settings

import (
	"cmp"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/signature"
)

// Config is the worker's configuration: every variable of the contract, read from the environment
// and overridden by its flag. Each field's default is its setting's, in the table vars.
type Config struct {
	KafkaBrokers        []string
	KafkaGroupID        string
	KafkaSessionTimeout time.Duration
	KafkaSASLMechanism  string // "", PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
	KafkaUsername       string
	KafkaPassword       string
	KafkaTLS            bool

	DatabaseURL string

	// Routes are the settings of each route (routes.go), by name.
	Routes    map[string]*RouteSettings
	DLQSuffix string
	// OutboxRetention is how long an event stays in the outbox table, from when it was written; an
	// event is never purged before it is published.
	OutboxRetention time.Duration
	// OutboxRelay runs the worker's relay of the outbox; false leaves the outbox to another relay
	// (Debezium), the events still written.
	OutboxRelay bool

	// PaymentSignature is how payment callbacks are verified: off or standard-webhooks, with
	// PaymentSigningKeys, a signature made at most PaymentSignatureTolerance from its record.
	PaymentSignature          string
	PaymentSigningKeys        signature.Keys
	PaymentSignatureTolerance time.Duration

	// PaymentStatusURL, when set, is the provider's status endpoint, asked with PaymentStatusToken
	// about the orders PENDING past ReconcileAfter, at most PaymentStatusRateLimit a second for
	// the group, until ReconcileMaxAge (package reconcile).
	PaymentStatusURL       string
	PaymentStatusToken     string
	PaymentStatusRateLimit int
	ReconcileAfter         time.Duration
	ReconcileMaxAge        time.Duration

	SMSProviderURL   string
	SMSProviderToken string
	// SMSProviderTimeout bounds each request to the provider, its answer included. The SMS route's
	// lease is twice it (Config.SMSCallLease).
	SMSProviderTimeout time.Duration
	// SMSValidity and SMSRecipientLimits decline SMS too old to be of use, and over their
	// recipient's limits (package notify); nil: none.
	SMSValidity        notify.Validity
	SMSRecipientLimits notify.RecipientLimits

	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration
	RetryMaxElapsed      time.Duration
	RetryParkAfter       time.Duration

	// KillSwitchAfter, KillSwitchRate (a percentage) and KillSwitchMaxProbeInterval configure the
	// routes' kill switch (inboxworker.KillSwitch).
	KillSwitchAfter            int
	KillSwitchRate             int
	KillSwitchMaxProbeInterval time.Duration

	BatchSize int
	BatchWait time.Duration

	Ordering    string // key or partition
	MaxInFlight int

	// LagInterval is how often the consumer_lag metric is refreshed. Defaults to 5s.
	LagInterval time.Duration
	// CommitFailureTimeout is how long offset commits may fail before /readyz says 503.
	CommitFailureTimeout time.Duration

	HTTPAddr        string
	ShutdownTimeout time.Duration
	StartupTimeout  time.Duration

	LogLevel  slog.Level
	LogFormat string // json or text
	// LogOutcomes logs a line at info for each payment callback applied; false logs it at debug.
	LogOutcomes bool

	DevKafkaAddr string
	// DevTopics are topics of a team's own routes that worker dev creates too, each with its
	// dead-letter topic.
	DevTopics []string

	// Receipts consumes the optional routes (the order events, which ask for the payment-received
	// SMS) unless turned off ("-"), whether their topics were set or not: worker dev and worker
	// demo, whose embedded broker creates the topics.
	Receipts bool

	// NoMigrate skips the migrations at start (worker run --no-migrate). A flag only.
	NoMigrate bool

	// routes are the binary's routes, and all the settings they make (All).
	routes []Route
	all    []*Var
	// used are the settings of the command being run, for the startup log line.
	used []*Var
	// resolved is where each setting came from and how the startup line shows it.
	resolved *envflag.Resolved
}

// vars are every configuration variable but the routes' (routes.go), in the order --help and
// the startup log list them.
// Each entry is all there is to a setting (variable, flag, default, help, how the startup line
// shows it, which commands read it, its parser): adding one is adding an entry and its field.
var vars = []*Var{
	{Env: "KAFKA_BROKERS", Flag: "kafka-brokers", Default: "127.0.0.1:9092", Meta: "LIST", Use: UseBrokers,
		Usage: "comma-separated bootstrap brokers (host:port)",
		Set:   func(c *Config, v string) error { return envflag.AddrList(&c.KafkaBrokers, v) }},
	{Env: "KAFKA_GROUP_ID", Flag: "kafka-group-id", Default: "inboxworker", Meta: "NAME", Use: UseTopics,
		Usage: "consumer group",
		Set:   func(c *Config, v string) error { return envflag.NonEmpty(&c.KafkaGroupID, v) }},
	{Env: "KAFKA_SESSION_TIMEOUT", Flag: "kafka-session-timeout", Default: "10s", Meta: "DURATION", Use: UseWorker,
		Usage: "how soon the group notices a dead worker and hands its partitions on",
		Bound: envflag.Durations(500*time.Millisecond, 30*time.Minute),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.KafkaSessionTimeout, v) }},
	{Env: "KAFKA_SASL_MECHANISM", Flag: "kafka-sasl-mechanism", Meta: "NAME", Use: UseBrokers,
		Shown: strings.ToUpper,
		Usage: "SASL mechanism for managed Kafka: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (unset: no SASL)",
		Set: func(c *Config, v string) error {
			switch m := strings.ToUpper(v); m {
			case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
				c.KafkaSASLMechanism = m
				return nil
			}
			return fmt.Errorf("unknown mechanism %q (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", v)
		}},
	{Env: "KAFKA_USERNAME", Flag: "kafka-username", Meta: "NAME", Use: UseBrokers,
		Usage: "SASL user name",
		Set:   func(c *Config, v string) error { c.KafkaUsername = v; return nil }},
	{Env: "KAFKA_PASSWORD", Flag: "kafka-password", Meta: "SECRET", Shown: secret, Use: UseBrokers,
		Usage: "SASL password (never logged)",
		Set:   func(c *Config, v string) error { c.KafkaPassword = v; return nil }},
	{Env: "KAFKA_TLS", Flag: "kafka-tls", Default: "false", Use: UseBrokers,
		Usage: "connect to the brokers over TLS",
		Set:   func(c *Config, v string) error { return envflag.Bool(&c.KafkaTLS, v) }},
	{Env: "DATABASE_URL", Flag: "database-url", Meta: "URL", Shown: url, Use: UseDatabase,
		Default: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Usage:   "Postgres holding the inbox and the business tables",
		Set:     func(c *Config, v string) error { return parseDatabaseURL(&c.DatabaseURL, v) }},
	{Env: "DLQ_SUFFIX", Flag: "dlq-suffix", Default: ".dlq", Meta: "SUFFIX", Use: UseTopics | UseReplay | UseParked | UseInspect,
		Usage: "dead-letter topic = source topic + suffix",
		Set:   func(c *Config, v string) error { return parseTopic(&c.DLQSuffix, v) }},
	{Env: "PAYMENT_SIGNATURE", Flag: "payment-signature", Default: "off", Meta: "SCHEME", Use: UseTopics,
		Usage: "off, or standard-webhooks: every payment callback must carry a valid webhook-signature by a key of " +
			"PAYMENT_SIGNING_KEYS, or it is dead-lettered bad_signature",
		Set: func(c *Config, v string) error {
			return envflag.OneOf(&c.PaymentSignature, v, "scheme", "off", "standard-webhooks")
		}},
	{Env: "PAYMENT_SIGNING_KEYS", Flag: "payment-signing-keys", Meta: "LIST", Shown: keyNames, Use: UseTopics,
		Usage: "the keys payment callbacks are signed with, comma-separated NAME:whsec_<base64> (HMAC-SHA256 secret) or " +
			"NAME:whpk_<base64> (Ed25519 public key); several while a key rotates (only the names are ever logged)",
		Set: func(c *Config, v string) (err error) {
			if v == "" {
				c.PaymentSigningKeys = nil
				return nil
			}
			c.PaymentSigningKeys, err = signature.ParseKeys(v)
			return err
		}},
	{Env: "PAYMENT_SIGNATURE_TOLERANCE", Flag: "payment-signature-tolerance", Default: "5m", Meta: "DURATION", Use: UseTopics,
		Usage: "most time between a callback's webhook-timestamp and its record's timestamp, when the receiver produced it",
		Bound: envflag.Durations(time.Second, 24*time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.PaymentSignatureTolerance, v) }},
	{Env: "PAYMENT_STATUS_URL", Flag: "payment-status-url", Meta: "URL", Shown: url, Use: UseTopics,
		Usage: "the payment provider's status endpoint, asked about each order left PENDING (GET URL?order_no=…); " +
			"unset: no reconciliation",
		Set: func(c *Config, v string) error { c.PaymentStatusURL = v; return nil }},
	{Env: "PAYMENT_STATUS_TOKEN", Flag: "payment-status-token", Meta: "SECRET", Shown: secret, Use: UseTopics,
		Usage: "sent to the status endpoint as Authorization: Bearer (never logged)",
		Set:   func(c *Config, v string) error { c.PaymentStatusToken = v; return nil }},
	{Env: "PAYMENT_STATUS_RATE_LIMIT", Flag: "payment-status-rate-limit", Default: "10", Meta: "N", Use: UseTopics,
		Usage: "most requests a second to the status endpoint, for the whole consumer group",
		Bound: envflag.Counts(1, 10000),
		Set:   func(c *Config, v string) error { return envflag.Positive(&c.PaymentStatusRateLimit, v) }},
	{Env: "RECONCILE_AFTER", Flag: "reconcile-after", Default: "10m", Meta: "DURATION", Use: UseTopics,
		Usage: "how long after its creation a PENDING order is first asked about; then again at doubling intervals, at most an hour apart",
		Bound: envflag.Durations(time.Second, 24*time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.ReconcileAfter, v) }},
	{Env: "RECONCILE_MAX_AGE", Flag: "reconcile-max-age", Default: "72h", Meta: "DURATION", Use: UseTopics,
		Usage: "the age after which a PENDING order is no longer asked about: left PENDING and counted, never cancelled",
		Bound: envflag.Durations(time.Minute, 8760*time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.ReconcileMaxAge, v) }},
	{Env: "SMS_PROVIDER_URL", Flag: "sms-provider-url", Meta: "URL", Shown: url, Use: UseTopics,
		Usage: "HTTP SMS gateway (unset: SMS are only logged, with a warning at start)",
		Set:   func(c *Config, v string) error { c.SMSProviderURL = v; return nil }},
	{Env: "SMS_PROVIDER_TOKEN", Flag: "sms-provider-token", Meta: "SECRET", Shown: secret, Use: UseTopics,
		Usage: "sent to the SMS gateway as Authorization: Bearer (never logged)",
		Set:   func(c *Config, v string) error { c.SMSProviderToken = v; return nil }},
	{Env: "SMS_PROVIDER_TIMEOUT", Flag: "sms-provider-timeout", Default: "10s", Meta: "DURATION", Use: UseTopics,
		Usage: "how long the SMS gateway may take to answer a request; the send's lease is twice it, so that no " +
			"other send of the key starts while the gateway may still be working on one the worker gave up on",
		Bound: envflag.Durations(100*time.Millisecond, 15*time.Second),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.SMSProviderTimeout, v) }},
	{Env: "SMS_VALIDITY", Flag: "sms-validity", Meta: "LIST", Use: UseTopics,
		Usage: "per template, how long after it was produced an SMS is still sent, e.g. verify_code=5m,login_code=2m " +
			"(each 1s to 168h; an event's expires_at wins; unset: no expiry); an older one is recorded EXPIRED, not sent",
		Set: func(c *Config, v string) (err error) { c.SMSValidity, err = notify.ParseValidity(v); return err }},
	{Env: "SMS_RECIPIENT_LIMIT", Flag: "sms-recipient-limit", Meta: "LIST", Use: UseTopics,
		Usage: "per template, the most SMS to one number in each window, e.g. verify_code=1/1m;5/1h;10/24h " +
			"(counts 1 to 10000, periods 1s to 720h, at most 8 windows; unset: no limit); one over it is recorded SUPPRESSED, not sent",
		Set: func(c *Config, v string) (err error) {
			c.SMSRecipientLimits, err = notify.ParseRecipientLimits(v)
			return err
		}},
	{Env: "RETRY_INITIAL_INTERVAL", Flag: "retry-initial-interval", Default: "200ms", Meta: "DURATION", Use: UseWorker,
		Usage: "first backoff of a retryable handler error (exponential, with jitter)",
		Bound: envflag.Durations(10*time.Millisecond, time.Minute),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.RetryInitialInterval, v) }},
	{Env: "RETRY_MAX_INTERVAL", Flag: "retry-max-interval", Default: "30s", Meta: "DURATION", Use: UseWorker,
		Usage: "longest backoff between two attempts",
		Bound: envflag.Durations(10*time.Millisecond, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.RetryMaxInterval, v) }},
	{Env: "RETRY_MAX_ELAPSED", Flag: "retry-max-elapsed", Default: "5m", Meta: "DURATION", Use: UseWorker | UseParked,
		Usage: "retry budget of one message, after which it is dead-lettered",
		Bound: envflag.Durations(100*time.Millisecond, 7*24*time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.RetryMaxElapsed, v) }},
	{Env: "RETRY_PARK_AFTER", Flag: "retry-park-after", Default: "5s", Meta: "DURATION", Use: UseWorker,
		Usage: "how long a message is retried in place before it is parked, out of its partition's way (ORDERING=key)",
		Bound: envflag.Durations(100*time.Millisecond, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.RetryParkAfter, v) }},
	{Env: "KILL_SWITCH_AFTER", Flag: "kill-switch-after", Default: "10", Meta: "N", Use: UseWorker,
		Usage: "failures of one kind, from 3 keys or more, that pause a route instead of retrying or dead-lettering " +
			"the rest (in a row, or KILL_SWITCH_RATE of a minute's results)",
		Bound: envflag.Counts(3, 1000),
		Set:   func(c *Config, v string) error { return envflag.Positive(&c.KillSwitchAfter, v) }},
	{Env: "KILL_SWITCH_RATE", Flag: "kill-switch-rate", Default: "50", Meta: "PERCENT", Use: UseWorker,
		Usage: "share of a minute's results that, failed, pauses a route once KILL_SWITCH_AFTER have failed",
		Bound: envflag.Counts(1, 100),
		Set:   func(c *Config, v string) error { return envflag.Positive(&c.KillSwitchRate, v) }},
	{Env: "KILL_SWITCH_MAX_PROBE_INTERVAL", Flag: "kill-switch-max-probe-interval", Default: "30s", Meta: "DURATION",
		Use:   UseWorker,
		Usage: "longest wait between two probes of a paused route (the first after 1s, then doubling)",
		Bound: envflag.Durations(time.Second, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.KillSwitchMaxProbeInterval, v) }},
	{Env: "OUTBOX_RETENTION", Flag: "outbox-retention", Default: "24h", Meta: "DURATION", Use: UseWorker,
		Usage: "how long an event stays in the outbox table, from when it was written, before it is purged once published",
		Bound: envflag.Durations(time.Minute, 720*time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.OutboxRetention, v) }},
	{Env: "OUTBOX_RELAY", Flag: "outbox-relay", Default: "true", Use: UseWorker,
		Usage: "publish the outbox's events with the worker's relay (false: the events are still written to the outbox table, for Debezium to relay)",
		Set:   func(c *Config, v string) error { return envflag.Bool(&c.OutboxRelay, v) }},
	{Env: "BATCH_SIZE", Flag: "batch-size", Default: "256", Meta: "N", Use: UseWorker,
		Usage: "most messages of one partition applied in one transaction (1: a transaction per message)",
		Bound: envflag.Counts(1, 10000),
		Set:   func(c *Config, v string) error { return envflag.Positive(&c.BatchSize, v) }},
	{Env: "BATCH_WAIT", Flag: "batch-wait", Default: "5ms", Meta: "DURATION", Use: UseWorker,
		Usage: "how long a batch waits for more messages after its first",
		Bound: envflag.Durations(time.Millisecond, time.Second),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.BatchWait, v) }},
	{Env: "LAG_INTERVAL", Flag: "lag-interval", Default: "5s", Meta: "DURATION", Use: UseWorker,
		Usage: "how often the consumer_lag metric is refreshed",
		Bound: envflag.Durations(100*time.Millisecond, 10*time.Minute),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.LagInterval, v) }},
	{Env: "OFFSET_COMMIT_FAILURE_TIMEOUT", Flag: "offset-commit-failure-timeout", Default: "1m", Meta: "DURATION",
		Use: UseWorker, Usage: "how long offset commits may fail, none succeeding, before /readyz answers 503",
		Bound: envflag.Durations(time.Second, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.CommitFailureTimeout, v) }},
	{Env: "ORDERING", Flag: "ordering", Default: "key", Meta: "MODE", Use: UseWorker,
		Usage: "which messages of a partition run one after another: those of one Kafka key (key), or all (partition)",
		Set:   func(c *Config, v string) error { return envflag.OneOf(&c.Ordering, v, "ordering", "key", "partition") }},
	{Env: "MAX_IN_FLIGHT", Flag: "max-in-flight", Default: "256", Meta: "N", Use: UseWorker,
		Usage: "most messages of one partition fetched and not yet committed",
		Bound: envflag.Counts(1, 10000),
		Set:   func(c *Config, v string) error { return envflag.Positive(&c.MaxInFlight, v) }},
	{Env: "HTTP_ADDR", Flag: "http-addr", Default: ":8080", Meta: "ADDR", Use: UseWorker,
		Usage: "address of /metrics, /healthz and /readyz",
		Set:   func(c *Config, v string) error { return envflag.Addr(&c.HTTPAddr, v) }},
	{Env: "SHUTDOWN_TIMEOUT", Flag: "shutdown-timeout", Default: "30s", Meta: "DURATION", Use: UseWorker,
		Usage: "on SIGTERM, how long in-flight messages may take to finish",
		Bound: envflag.Durations(time.Second, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.ShutdownTimeout, v) }},
	{Env: "STARTUP_TIMEOUT", Flag: "startup-timeout", Default: "15s", Meta: "DURATION", Use: UseDatabase,
		Usage: "how long to wait for Postgres and Kafka at start before giving up",
		Bound: envflag.Durations(100*time.Millisecond, time.Hour),
		Set:   func(c *Config, v string) error { return envflag.PositiveDuration(&c.StartupTimeout, v) }},
	{Env: "LOG_LEVEL", Flag: "log-level", Default: "info", Meta: "LEVEL", Use: UseDatabase,
		Usage: "debug, info, warn or error",
		Set: func(c *Config, v string) error {
			if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("invalid level %q (use debug, info, warn or error)", v)
			}
			return nil
		}},
	{Env: "LOG_FORMAT", Flag: "log-format", Default: "json", Meta: "FORMAT", Use: UseDatabase,
		Usage: "json (one object per line) or text (for people)",
		Set: func(c *Config, v string) error {
			switch v {
			case "json", "text":
				c.LogFormat = v
				return nil
			}
			return fmt.Errorf("invalid format %q (use json or text)", v)
		}},
	{Env: "LOG_OUTCOMES", Flag: "log-outcomes", Default: "true", Use: UseTopics,
		Usage: "log a line at info for each payment callback applied (false: at debug, for a worker applying more than its log should carry)",
		Set:   func(c *Config, v string) error { return envflag.Bool(&c.LogOutcomes, v) }},
	{Env: "DEV_KAFKA_ADDR", Flag: "dev-kafka-addr", Default: "127.0.0.1:9092", Meta: "ADDR", Use: UseDev | UseDemo,
		Usage: "where the embedded broker of worker dev and worker demo listens",
		Set:   func(c *Config, v string) error { return envflag.Addr(&c.DevKafkaAddr, v) }},
	{Env: "DEV_TOPICS", Flag: "dev-topics", Meta: "LIST", Use: UseDev,
		Usage: "comma-separated topics of your own routes that worker dev creates on its embedded broker too, each with its dead-letter topic (at most 100)",
		Set:   func(c *Config, v string) error { return parseTopicList(&c.DevTopics, v) }},
	{Flag: "no-migrate", Default: "false", Use: UseRun,
		Usage: "do not apply pending migrations at start",
		Set:   func(c *Config, v string) error { return envflag.Bool(&c.NoMigrate, v) }},
}

// retentionBound bounds an explicit inbox retention: under an hour a key is forgotten while a
// restart's redelivery of its message may still come; over ten years no topic keeps a message
// (one that keeps them forever gets 30 days by default).
var retentionBound = envflag.Durations(time.Hour, 10*365*24*time.Hour)

// keyNames is how the startup line shows PAYMENT_SIGNING_KEYS: the keys' names, never a key.
func keyNames(v string) string {
	var names []string
	for item := range strings.SplitSeq(v, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(item), ":")
		names = append(names, name)
	}
	if v == "" {
		return ""
	}
	return strings.Join(names, ",")
}

// settledFromTopic is how the startup line shows an inbox retention: unset ones are settled later,
// from the topic.
func settledFromTopic(v string) string { return cmp.Or(v, "from the topic") }

// check validates settings against one another, once each is parsed, and then as extra does (the
// binary's own checks, which build what a setting names); fail names a setting in an error as it
// was given.
func (c *Config) check(fail Fail, extra func(*Config, Fail) error) error {
	if err := c.checkSASL(fail); err != nil {
		return err
	}
	switch {
	case c.RetryInitialInterval > c.RetryMaxInterval:
		return fail("RETRY_INITIAL_INTERVAL", "%s is longer than RETRY_MAX_INTERVAL %s",
			c.RetryInitialInterval, c.RetryMaxInterval)
	case c.SMSProviderToken != "" && c.SMSProviderURL == "":
		return fail("SMS_PROVIDER_TOKEN", "set without SMS_PROVIDER_URL")
	case c.PaymentStatusToken != "" && c.PaymentStatusURL == "":
		return fail("PAYMENT_STATUS_TOKEN", "set without PAYMENT_STATUS_URL")
	case c.ReconcileAfter >= c.ReconcileMaxAge:
		return fail("RECONCILE_AFTER", "%s is not less than RECONCILE_MAX_AGE %s", c.ReconcileAfter, c.ReconcileMaxAge)
	case c.PaymentSignature == "standard-webhooks" && len(c.PaymentSigningKeys) == 0:
		return fail("PAYMENT_SIGNING_KEYS", "required with PAYMENT_SIGNATURE standard-webhooks")
	case c.PaymentSignature == "off" && len(c.PaymentSigningKeys) > 0:
		return fail("PAYMENT_SIGNING_KEYS", "set with PAYMENT_SIGNATURE off: callbacks would not be verified "+
			"(set PAYMENT_SIGNATURE standard-webhooks)")
	}
	if err := c.checkTopics(fail); err != nil {
		return err
	}
	if extra != nil {
		return extra(c, fail)
	}
	return nil
}

// SMSCallLease is the SMS route's lease on a key while its send is out: twice SMS_PROVIDER_TIMEOUT.
// The send gets two thirds of the lease, so the provider's timeout ends it first, with its own
// error; the rest covers a send the provider may still be working on after the worker gave up on
// it, during which no other send of the key starts. 0 (no timeout set): the route's default.
func (c *Config) SMSCallLease() time.Duration { return 2 * c.SMSProviderTimeout }

// OutcomeLevel is the level of the line logged for each message applied: info, unless LOG_OUTCOMES
// is false.
func (c *Config) OutcomeLevel() slog.Level {
	if c.LogOutcomes {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// checkSASL says what is missing of the brokers' authentication: a mechanism needs a user and a
// password, and they need a mechanism.
func (c *Config) checkSASL(fail Fail) error {
	switch {
	case c.KafkaSASLMechanism != "" && c.KafkaUsername == "":
		return fail("KAFKA_USERNAME", "required with KAFKA_SASL_MECHANISM %s", c.KafkaSASLMechanism)
	case c.KafkaSASLMechanism != "" && c.KafkaPassword == "":
		return fail("KAFKA_PASSWORD", "required with KAFKA_SASL_MECHANISM %s", c.KafkaSASLMechanism)
	case c.KafkaSASLMechanism == "" && (c.KafkaUsername != "" || c.KafkaPassword != ""):
		return fail("KAFKA_SASL_MECHANISM", "required when KAFKA_USERNAME or KAFKA_PASSWORD is set")
	}
	return nil
}

// Shown is how the startup line shows the setting env: a secret masked, a URL's password, a
// signing key by its name.
func (c *Config) Shown(env string) string { return c.resolved.Shown[env] }

// Use says which settings the command being run reads: the startup line's (StartupAttrs).
func (c *Config) Use(used []*Var) { c.used = used }

// StartupAttrs are the startup line's configuration: the settings of the command, as shown.
func (c *Config) StartupAttrs() []slog.Attr {
	var attrs []slog.Attr
	for _, s := range c.used {
		if s.Env != "" {
			attrs = append(attrs, slog.String(s.Env, c.Shown(s.Env)))
		}
	}
	return attrs
}
