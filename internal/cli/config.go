package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config is the worker's configuration: every variable of the contract, read from the environment
// and overridden by its flag.
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
	RetryParkAfter       time.Duration

	// InboxRetentionPayments and InboxRetentionSMS are how long idempotency keys are remembered.
	// Zero (the default) means "as long as the topic can redeliver": settled at start from the
	// topic's configuration (see settleRetention).
	InboxRetentionPayments time.Duration
	InboxRetentionSMS      time.Duration

	BatchSize int
	BatchWait time.Duration

	// LagInterval is how often the consumer_lag metric is refreshed. Defaults to 5s.
	LagInterval         time.Duration
	Ordering            string // key or partition
	MaxInFlight         int
	PaymentsConcurrency int
	SMSConcurrency      int

	HTTPAddr        string
	ShutdownTimeout time.Duration
	StartupTimeout  time.Duration

	LogLevel  slog.Level
	LogFormat string // json or text

	DevKafkaAddr string

	// NoMigrate skips the migrations at start (worker run --no-migrate). A flag only.
	NoMigrate bool

	// The options of worker replay, flags only: the reason to replay ("" for all), whether to
	// write nothing, and how many dead letters to replay at most (0 for all).
	ReplayReason string
	ReplayDryRun bool
	ReplayLimit  int

	// used are the settings of the command being run, for the startup log line.
	used []*setting
	// explicit holds the env names of the settings given by flag or environment, not defaulted.
	explicit map[string]bool
}

// A setting is one configuration variable: its environment name, its flag, its default and how it is
// parsed into a Config.
type setting struct {
	env   string
	flag  string
	def   string
	usage string
	// meta names the value in --help (LIST, DURATION...); empty for a boolean.
	meta string
	// secret values are never printed.
	secret bool
	// envless settings are flags only.
	envless bool
	set     func(c *Config, v string) error
}

func (s *setting) boolean() bool { return s.meta == "" }

// settings are every configuration variable, in the order --help and the startup log list them.
var settings = []*setting{
	{env: "KAFKA_BROKERS", flag: "kafka-brokers", def: "127.0.0.1:9092", meta: "LIST",
		usage: "comma-separated bootstrap brokers (host:port)",
		set: func(c *Config, v string) (err error) {
			c.KafkaBrokers, err = parseAddrList(v)
			return err
		}},
	{env: "KAFKA_GROUP_ID", flag: "kafka-group-id", def: "inboxworker", meta: "NAME",
		usage: "consumer group",
		set:   func(c *Config, v string) error { return parseNonEmpty(&c.KafkaGroupID, v) }},
	{env: "KAFKA_SESSION_TIMEOUT", flag: "kafka-session-timeout", def: "10s", meta: "DURATION",
		usage: "how soon the group notices a dead worker and hands its partitions on",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.KafkaSessionTimeout, v) }},
	{env: "KAFKA_SASL_MECHANISM", flag: "kafka-sasl-mechanism", meta: "NAME",
		usage: "SASL mechanism for managed Kafka: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (unset: no SASL)",
		set: func(c *Config, v string) error {
			switch m := strings.ToUpper(v); m {
			case "", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
				c.KafkaSASLMechanism = m
				return nil
			}
			return fmt.Errorf("unknown mechanism %q (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", v)
		}},
	{env: "KAFKA_USERNAME", flag: "kafka-username", meta: "NAME",
		usage: "SASL user name",
		set:   func(c *Config, v string) error { c.KafkaUsername = v; return nil }},
	{env: "KAFKA_PASSWORD", flag: "kafka-password", meta: "SECRET", secret: true,
		usage: "SASL password (never logged)",
		set:   func(c *Config, v string) error { c.KafkaPassword = v; return nil }},
	{env: "KAFKA_TLS", flag: "kafka-tls", def: "false",
		usage: "connect to the brokers over TLS",
		set:   func(c *Config, v string) error { return parseBool(&c.KafkaTLS, v) }},
	{env: "DATABASE_URL", flag: "database-url", meta: "URL",
		def:   "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		usage: "Postgres holding the inbox and the business tables",
		set:   func(c *Config, v string) error { return parseDatabaseURL(&c.DatabaseURL, v) }},
	{env: "TOPIC_PAYMENTS", flag: "topic-payments", def: "payments.callbacks", meta: "TOPIC",
		usage: "payment callback topic",
		set:   func(c *Config, v string) error { return parseTopic(&c.TopicPayments, v) }},
	{env: "TOPIC_SMS", flag: "topic-sms", def: "notifications.sms", meta: "TOPIC",
		usage: "SMS event topic",
		set:   func(c *Config, v string) error { return parseTopic(&c.TopicSMS, v) }},
	{env: "DLQ_SUFFIX", flag: "dlq-suffix", def: ".dlq", meta: "SUFFIX",
		usage: "dead-letter topic = source topic + suffix",
		set:   func(c *Config, v string) error { return parseTopic(&c.DLQSuffix, v) }},
	{env: "SMS_PROVIDER_URL", flag: "sms-provider-url", meta: "URL",
		usage: "HTTP SMS gateway (unset: SMS are only logged, with a warning at start)",
		set:   func(c *Config, v string) error { return parseHTTPURL(&c.SMSProviderURL, v) }},
	{env: "SMS_PROVIDER_TOKEN", flag: "sms-provider-token", meta: "SECRET", secret: true,
		usage: "sent to the SMS gateway as Authorization: Bearer (never logged)",
		set:   func(c *Config, v string) error { c.SMSProviderToken = v; return nil }},
	{env: "RETRY_INITIAL_INTERVAL", flag: "retry-initial-interval", def: "200ms", meta: "DURATION",
		usage: "first backoff of a retryable handler error (exponential, with jitter)",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryInitialInterval, v) }},
	{env: "RETRY_MAX_INTERVAL", flag: "retry-max-interval", def: "30s", meta: "DURATION",
		usage: "longest backoff between two attempts",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryMaxInterval, v) }},
	{env: "RETRY_MAX_ELAPSED", flag: "retry-max-elapsed", def: "5m", meta: "DURATION",
		usage: "retry budget of one message, after which it is dead-lettered",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryMaxElapsed, v) }},
	{env: "RETRY_PARK_AFTER", flag: "retry-park-after", def: "5s", meta: "DURATION",
		usage: "how long a message is retried in place before it is parked, out of its partition's way (ORDERING=key)",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.RetryParkAfter, v) }},
	{env: "INBOX_RETENTION_PAYMENTS", flag: "inbox-retention-payments", meta: "DURATION",
		usage: "how long a payment callback's idempotency key is remembered " +
			"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
		set: func(c *Config, v string) error { return parseOptionalDuration(&c.InboxRetentionPayments, v) }},
	{env: "INBOX_RETENTION_SMS", flag: "inbox-retention-sms", meta: "DURATION",
		usage: "how long an SMS event's idempotency key is remembered " +
			"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
		set: func(c *Config, v string) error { return parseOptionalDuration(&c.InboxRetentionSMS, v) }},
	{env: "BATCH_SIZE", flag: "batch-size", def: "256", meta: "N",
		usage: "most messages of one partition applied in one transaction (1: a transaction per message)",
		set:   func(c *Config, v string) error { return parseLimit(&c.BatchSize, v) }},
	{env: "BATCH_WAIT", flag: "batch-wait", def: "5ms", meta: "DURATION",
		usage: "how long a batch waits for more messages after its first",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.BatchWait, v) }},
	{env: "LAG_INTERVAL", flag: "lag-interval", def: "5s", meta: "DURATION",
		usage: "how often the consumer_lag metric is refreshed",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.LagInterval, v) }},
	{env: "ORDERING", flag: "ordering", def: "key", meta: "MODE",
		usage: "which messages of a partition run one after another: those of one Kafka key (key), or all (partition)",
		set: func(c *Config, v string) error {
			switch v {
			case "key", "partition":
				c.Ordering = v
				return nil
			}
			return fmt.Errorf("unknown ordering %q (use key or partition)", v)
		}},
	{env: "MAX_IN_FLIGHT", flag: "max-in-flight", def: "256", meta: "N",
		usage: "most messages of one partition fetched and not yet committed",
		set:   func(c *Config, v string) error { return parsePositive(&c.MaxInFlight, v) }},
	{env: "PAYMENTS_CONCURRENCY", flag: "payments-concurrency", def: "4", meta: "N",
		usage: "most payment transactions (batches) at once, across partitions; each holds a database connection",
		set:   func(c *Config, v string) error { return parsePositive(&c.PaymentsConcurrency, v) }},
	{env: "SMS_CONCURRENCY", flag: "sms-concurrency", def: "128", meta: "N",
		usage: "most SMS being sent at once, across partitions",
		set:   func(c *Config, v string) error { return parsePositive(&c.SMSConcurrency, v) }},
	{env: "HTTP_ADDR", flag: "http-addr", def: ":8080", meta: "ADDR",
		usage: "address of /metrics, /healthz and /readyz",
		set:   func(c *Config, v string) error { return parseAddr(&c.HTTPAddr, v) }},
	{env: "SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", def: "30s", meta: "DURATION",
		usage: "on SIGTERM, how long in-flight messages may take to finish",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.ShutdownTimeout, v) }},
	{env: "STARTUP_TIMEOUT", flag: "startup-timeout", def: "15s", meta: "DURATION",
		usage: "how long to wait for Postgres and Kafka at start before giving up",
		set:   func(c *Config, v string) error { return parsePositiveDuration(&c.StartupTimeout, v) }},
	{env: "LOG_LEVEL", flag: "log-level", def: "info", meta: "LEVEL",
		usage: "debug, info, warn or error",
		set: func(c *Config, v string) error {
			if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
				return fmt.Errorf("invalid level %q (use debug, info, warn or error)", v)
			}
			return nil
		}},
	{env: "LOG_FORMAT", flag: "log-format", def: "json", meta: "FORMAT",
		usage: "json (one object per line) or text (for people)",
		set: func(c *Config, v string) error {
			switch v {
			case "json", "text":
				c.LogFormat = v
				return nil
			}
			return fmt.Errorf("invalid format %q (use json or text)", v)
		}},
	{env: "DEV_KAFKA_ADDR", flag: "dev-kafka-addr", def: "127.0.0.1:9092", meta: "ADDR",
		usage: "where the embedded broker of worker dev and worker demo listens",
		set:   func(c *Config, v string) error { return parseAddr(&c.DevKafkaAddr, v) }},
	{flag: "no-migrate", def: "false", envless: true,
		usage: "do not apply pending migrations at start",
		set:   func(c *Config, v string) error { return parseBool(&c.NoMigrate, v) }},
	{flag: "reason", meta: "REASON", envless: true,
		usage: "replay only the dead letters whose reason is REASON (unset: all)",
		set:   func(c *Config, v string) error { c.ReplayReason = v; return nil }},
	{flag: "dry-run", def: "false", envless: true,
		usage: "print what would be replayed and write nothing",
		set:   func(c *Config, v string) error { return parseBool(&c.ReplayDryRun, v) }},
	{flag: "limit", meta: "N", envless: true,
		usage: "replay at most N dead letters (unset: all)",
		set:   func(c *Config, v string) error { return parseLimit(&c.ReplayLimit, v) }},
}

func lookupSetting(env string) *setting {
	for _, s := range settings {
		if s.env == env {
			return s
		}
	}
	panic("cli: no setting " + env)
}

// name is how errors name the setting: its flag when the value came from the command line, else
// its environment variable.
func (s *setting) name(fromFlag bool) string {
	if fromFlag || s.envless {
		return "--" + s.flag
	}
	return s.env
}

// A settingError is a configuration error that names its setting: it is printed as one line.
type settingError struct {
	name string
	err  error
}

func (e *settingError) Error() string { return e.name + ": " + e.err.Error() }
func (e *settingError) Unwrap() error { return e.err }

// flagValue records a flag's raw text; settings are parsed after all sources are known, so that a
// bad value is reported the same way whether it came from a flag or the environment.
type flagValue struct {
	s     *setting
	value string
	isSet bool
}

func (v *flagValue) String() string     { return v.value }
func (v *flagValue) Set(s string) error { v.value, v.isSet = s, true; return nil }
func (v *flagValue) IsBoolFlag() bool   { return v.s.boolean() }

// configFlags binds the given settings to a flag set whose errors are returned, not printed.
type configFlags struct {
	fs     *flag.FlagSet
	values []*flagValue
}

func newConfigFlags(name string, ss []*setting) *configFlags {
	cf := &configFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	cf.fs.SetOutput(io.Discard)
	cf.fs.Usage = func() {}
	for _, s := range ss {
		v := &flagValue{s: s}
		cf.values = append(cf.values, v)
		cf.fs.Var(v, s.flag, s.usage)
	}
	return cf
}

// parse parses args, which may mix flags and positional arguments, and returns the positional ones.
// It returns flag.ErrHelp for -h/--help.
func (cf *configFlags) parse(args []string) ([]string, error) {
	var positional []string
	for {
		if err := cf.fs.Parse(args); err != nil {
			return nil, flagError(err)
		}
		if cf.fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, cf.fs.Arg(0))
		args = cf.fs.Args()[1:]
	}
}

// flagError rewrites the flag package's errors as one line in our style.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return fmt.Errorf("unknown flag --%s", strings.TrimLeft(name, "-"))
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return fmt.Errorf("--%s: missing value", strings.TrimLeft(name, "-"))
	}
	if strings.HasPrefix(msg, "bad flag syntax: ") {
		return errors.New(msg)
	}
	return err
}

// config resolves the settings bound to cf: the flag when given, else the environment, else the
// default; then checks the settings against one another.
func (cf *configFlags) config(getenv func(string) string) (*Config, error) {
	c := &Config{explicit: map[string]bool{}}
	// Settings a command does not use keep their defaults, so that every field is meaningful.
	bound := map[*setting]*flagValue{}
	for _, v := range cf.values {
		bound[v.s] = v
	}
	for _, s := range settings {
		raw, fromFlag := s.def, false
		if v := bound[s]; v != nil {
			if v.isSet {
				raw, fromFlag = v.value, true
				c.explicit[s.env] = true
			} else if e := getenv(s.env); e != "" && !s.envless {
				raw = e
				c.explicit[s.env] = true
			}
		}
		if err := s.set(c, raw); err != nil {
			return nil, &settingError{name: s.name(fromFlag), err: err}
		}
	}
	if err := c.check(func(env string) string {
		s := lookupSetting(env)
		if v := bound[s]; v != nil && v.isSet {
			return s.name(true)
		}
		return s.name(false)
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// check validates settings against one another. name tells how to name a setting in an error.
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
	case strings.ContainsFunc(c.SMSProviderToken, func(r rune) bool { return r < 0x21 || r > 0x7e }):
		return fail("SMS_PROVIDER_TOKEN", "must be printable ASCII without spaces")
	}
	return nil
}

// masked returns the effective configuration for the startup log line, secrets masked: by the kind of
// each setting, so that a new secret or URL setting is masked without a line of its own.
func (c *Config) masked(ss []*setting) []slog.Attr {
	values := map[string]string{
		"KAFKA_BROKERS":            strings.Join(c.KafkaBrokers, ","),
		"KAFKA_GROUP_ID":           c.KafkaGroupID,
		"KAFKA_SESSION_TIMEOUT":    c.KafkaSessionTimeout.String(),
		"KAFKA_SASL_MECHANISM":     c.KafkaSASLMechanism,
		"KAFKA_USERNAME":           c.KafkaUsername,
		"KAFKA_PASSWORD":           c.KafkaPassword,
		"KAFKA_TLS":                strconv.FormatBool(c.KafkaTLS),
		"DATABASE_URL":             c.DatabaseURL,
		"TOPIC_PAYMENTS":           c.TopicPayments,
		"TOPIC_SMS":                c.TopicSMS,
		"DLQ_SUFFIX":               c.DLQSuffix,
		"SMS_PROVIDER_URL":         c.SMSProviderURL,
		"SMS_PROVIDER_TOKEN":       c.SMSProviderToken,
		"RETRY_INITIAL_INTERVAL":   c.RetryInitialInterval.String(),
		"RETRY_MAX_INTERVAL":       c.RetryMaxInterval.String(),
		"RETRY_MAX_ELAPSED":        c.RetryMaxElapsed.String(),
		"RETRY_PARK_AFTER":         c.RetryParkAfter.String(),
		"INBOX_RETENTION_PAYMENTS": retentionText(c.InboxRetentionPayments),
		"INBOX_RETENTION_SMS":      retentionText(c.InboxRetentionSMS),
		"BATCH_SIZE":               strconv.Itoa(c.BatchSize),
		"BATCH_WAIT":               c.BatchWait.String(),
		"LAG_INTERVAL":             c.LagInterval.String(),
		"ORDERING":                 c.Ordering,
		"MAX_IN_FLIGHT":            strconv.Itoa(c.MaxInFlight),
		"PAYMENTS_CONCURRENCY":     strconv.Itoa(c.PaymentsConcurrency),
		"SMS_CONCURRENCY":          strconv.Itoa(c.SMSConcurrency),
		"HTTP_ADDR":                c.HTTPAddr,
		"SHUTDOWN_TIMEOUT":         c.ShutdownTimeout.String(),
		"STARTUP_TIMEOUT":          c.StartupTimeout.String(),
		"LOG_LEVEL":                c.LogLevel.String(),
		"LOG_FORMAT":               c.LogFormat,
		"DEV_KAFKA_ADDR":           c.DevKafkaAddr,
	}
	var attrs []slog.Attr
	for _, s := range ss {
		if s.envless {
			continue
		}
		v := values[s.env]
		switch {
		case s.secret:
			v = maskSecret(v)
		case s.meta == "URL":
			v = maskURL(v)
		}
		attrs = append(attrs, slog.String(s.env, v))
	}
	return attrs
}

// Parsers. Their errors do not name the setting: the caller does.

func parseNonEmpty(dst *string, v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("must not be empty")
	}
	*dst = v
	return nil
}

// parseOptionalDuration is parsePositiveDuration, with "" for 0: not set.
func parseOptionalDuration(dst *time.Duration, v string) error {
	if v == "" {
		*dst = 0
		return nil
	}
	return parsePositiveDuration(dst, v)
}

// retentionText is an inbox retention for the startup line: unset ones are settled later.
func retentionText(d time.Duration) string {
	if d == 0 {
		return "from the topic"
	}
	return d.String()
}

func parsePositiveDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("invalid duration %q", v)
	}
	if d <= 0 {
		return fmt.Errorf("must be positive, got %q", v)
	}
	*dst = d
	return nil
}

// parseLimit accepts a positive count, or nothing for no limit.
func parseLimit(dst *int, v string) error {
	if v == "" {
		*dst = 0
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("must be a positive number, got %q", v)
	}
	*dst = n
	return nil
}

// parsePositive accepts a positive count.
func parsePositive(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return fmt.Errorf("must be a positive number, got %q", v)
	}
	*dst = n
	return nil
}

func parseBool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("invalid boolean %q (use true or false)", v)
	}
	*dst = b
	return nil
}

func parseAddr(dst *string, v string) error {
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		return fmt.Errorf("invalid address %q (use host:port)", v)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("invalid port in %q", v)
	}
	*dst = v
	return nil
}

func parseAddrList(v string) ([]string, error) {
	var out []string
	for a := range strings.SplitSeq(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if err := parseAddr(&a, a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("must list at least one broker (host:port)")
	}
	return out, nil
}

var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// parseTopic accepts a Kafka topic name (or a DLQ suffix, which follows the same rules).
func parseTopic(dst *string, v string) error {
	if !topicName.MatchString(v) || len(v) > 249 {
		return fmt.Errorf("invalid topic name %q (letters, digits, '.', '_' and '-', at most 249)", v)
	}
	*dst = v
	return nil
}

func parseDatabaseURL(dst *string, v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("invalid URL %q", maskURL(v))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("invalid URL %q (want postgres://user:password@host:port/database)", maskURL(v))
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		return fmt.Errorf("invalid URL %q: no host", maskURL(v))
	}
	if _, err := pgxpool.ParseConfig(v); err != nil {
		return fmt.Errorf("invalid URL %q: %s", maskURL(v), parseConfigReason(err, v))
	}
	*dst = v
	return nil
}

// parseConfigReason is why pgx refused connString, without the connection string (and so without
// its password) that pgx's own messages repeat.
func parseConfigReason(err error, connString string) string {
	reason := err.Error()
	if p, _ := url.Parse(connString); p != nil {
		if password, ok := p.User.Password(); ok && password != "" {
			reason = strings.ReplaceAll(reason, password, mask)
		}
	}
	return pgxQuotedConnString.ReplaceAllString(reason, "")
}

// pgxQuotedConnString is how pgx quotes the connection string in its errors.
var pgxQuotedConnString = regexp.MustCompile("cannot parse `[^`]*`: ")

func parseHTTPURL(dst *string, v string) error {
	if v == "" {
		*dst = ""
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("invalid URL %q (want http:// or https://)", maskURL(v))
	}
	*dst = v
	return nil
}

const mask = "xxxxx"

func maskSecret(s string) string {
	if s == "" {
		return ""
	}
	return mask
}

var (
	urlPassword = regexp.MustCompile(`(://[^:/?#@]*:)[^@]*@`)
	kvPassword  = regexp.MustCompile(`(?i)((?:ssl)?password=)('[^']*'|[^ &]*)`)
	urlQuery    = regexp.MustCompile(`([?&][^=&#]*=)[^&#]*`)
)

// shownQueryParams are the query parameters whose values maskURL shows: Postgres connection
// parameters that are never secret. Any other value may be one (an SMS gateway's api_key, a
// signature, sslpassword) and is masked.
var shownQueryParams = map[string]bool{
	"sslmode": true, "user": true, "host": true, "port": true, "dbname": true, "application_name": true,
	"connect_timeout": true, "target_session_attrs": true, "search_path": true, "sslrootcert": true,
	"pool_max_conns": true, "pool_min_conns": true,
}

// maskURL masks what a URL setting may carry of a secret: the password of its user info and every
// query value but those of shownQueryParams; in a key=value connection string, its passwords. It
// works on strings that do not parse, too. Config.masked applies it to every setting whose value is a
// URL.
func maskURL(s string) string {
	if s == "" {
		return ""
	}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), mask)
		}
		if u.RawQuery != "" {
			u.RawQuery = maskQuery(u.RawQuery)
		}
		return u.String()
	}
	s = urlPassword.ReplaceAllString(s, "${1}"+mask+"@")
	if strings.Contains(s, "://") {
		s = urlQuery.ReplaceAllString(s, "${1}"+mask)
	}
	return kvPassword.ReplaceAllString(s, "${1}"+mask)
}

// maskQuery returns a URL's query, sorted by name, with every value masked but those of
// shownQueryParams, and a name without a value (which may be a key itself, as in ?K3Y) masked whole.
func maskQuery(rawQuery string) string {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return mask
	}
	parts := make([]string, 0, len(q))
	for _, name := range slices.Sorted(maps.Keys(q)) {
		for _, v := range q[name] {
			switch {
			case shownQueryParams[strings.ToLower(name)]:
				parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(v))
			case v == "":
				parts = append(parts, mask)
			default:
				parts = append(parts, url.QueryEscape(name)+"="+mask)
			}
		}
	}
	return strings.Join(parts, "&")
}
