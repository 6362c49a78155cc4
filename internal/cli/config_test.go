package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/settings"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// result is what Main did: its exit code and its output.
type result struct {
	code           int
	stdout, stderr string
}

// runMain runs Main in-process with env as the whole environment.
func runMain(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), args, func(k string) string { return env[k] }, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// TestConfigErrors checks that every bad setting ends at once with exit code 1 and one line naming
// it, before anything is connected to.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"BadDurationEnv", map[string]string{"RETRY_MAX_ELAPSED": "abc"}, []string{"run"},
			`worker: RETRY_MAX_ELAPSED: invalid duration "abc"`},
		{"BadDurationFlag", nil, []string{"run", "--shutdown-timeout=5"},
			`worker: --shutdown-timeout: invalid duration "5"`},
		{"NegativeDuration", map[string]string{"INBOX_RETENTION_SMS": "-1h"}, []string{"run"},
			`worker: INBOX_RETENTION_SMS: must be positive, got "-1h"`},
		{"FlagBadEvenWhenEnvGood", map[string]string{"STARTUP_TIMEOUT": "1s"}, []string{"run", "--startup-timeout", "x"},
			`worker: --startup-timeout: invalid duration "x"`},
		{"UnknownFlag", nil, []string{"run", "--kafka-broker=x:1"},
			`worker: unknown flag --kafka-broker (see worker run --help)`},
		{"MissingValue", nil, []string{"run", "--kafka-brokers"},
			`worker: --kafka-brokers: missing value (see worker run --help)`},
		{"FlagOfAnotherCommand", nil, []string{"migrate", "--kafka-brokers=x:1"},
			`worker: unknown flag --kafka-brokers (see worker migrate --help)`},
		{"BadBool", map[string]string{"KAFKA_TLS": "maybe"}, []string{"run"},
			`worker: KAFKA_TLS: invalid boolean "maybe" (use true or false)`},
		{"BadBrokers", map[string]string{"KAFKA_BROKERS": "kafka"}, []string{"run"},
			`worker: KAFKA_BROKERS: invalid address "kafka" (use host:port)`},
		{"NoBrokers", map[string]string{"KAFKA_BROKERS": " , "}, []string{"run"},
			`worker: KAFKA_BROKERS: must list at least one broker (host:port)`},
		{"BadDatabaseURLMasked", map[string]string{"DATABASE_URL": "mysql://app:s3cret@db:3306/shop"}, []string{"migrate"},
			`worker: DATABASE_URL: invalid URL "mysql://app:xxxxx@db:3306/shop" (want postgres://user:password@host:port/database)`},
		{"DatabaseURLFlagMasked", nil, []string{"migrate", "--database-url", "postgres://app:s3cret@/shop"},
			`worker: --database-url: invalid URL "postgres://app:xxxxx@/shop": no host`},
		{"DatabaseURLRefusedByPgx", map[string]string{"DATABASE_URL": "postgres://app:s3cret@db:99999/shop"}, []string{"run"},
			`worker: DATABASE_URL: invalid URL "postgres://app:xxxxx@db:99999/shop": invalid port`},
		{"UnknownSASL", map[string]string{"KAFKA_SASL_MECHANISM": "GSSAPI"}, []string{"run"},
			`worker: KAFKA_SASL_MECHANISM: unknown mechanism "GSSAPI" (use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)`},
		{"SASLWithoutPassword", map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_USERNAME": "u"}, []string{"run"},
			`worker: KAFKA_PASSWORD: required with KAFKA_SASL_MECHANISM PLAIN`},
		{"CredentialsWithoutSASL", map[string]string{"KAFKA_USERNAME": "u", "KAFKA_PASSWORD": "p"}, []string{"run"},
			`worker: KAFKA_SASL_MECHANISM: required when KAFKA_USERNAME or KAFKA_PASSWORD is set`},
		{"SameTopics", map[string]string{"TOPIC_SMS": "payments.callbacks"}, []string{"run"},
			`worker: TOPIC_SMS: must differ from TOPIC_PAYMENTS (both are "payments.callbacks")`},
		{"BadTopic", nil, []string{"run", "--topic-sms", "sms events"},
			`worker: --topic-sms: invalid topic name "sms events" (letters, digits, '.', '_' and '-', at most 249)`},
		{"RetryIntervals", map[string]string{"RETRY_INITIAL_INTERVAL": "1m"}, []string{"run"},
			`worker: RETRY_INITIAL_INTERVAL: 1m0s is longer than RETRY_MAX_INTERVAL 30s`},
		{"BadProviderURL", map[string]string{"SMS_PROVIDER_URL": "ftp://u:tok@sms"}, []string{"run"},
			`worker: SMS_PROVIDER_URL: invalid URL "ftp://u:xxxxx@sms" (want http:// or https://)`},
		{"BadBatchSize", map[string]string{"BATCH_SIZE": "0"}, []string{"run"},
			`worker: BATCH_SIZE: must be a positive number, got "0"`},
		{"BadOrdering", map[string]string{"ORDERING": "offset"}, []string{"run"},
			`worker: ORDERING: unknown ordering "offset" (use key or partition)`},
		{"BadSMSConcurrency", map[string]string{"SMS_CONCURRENCY": "0"}, []string{"run"},
			`worker: SMS_CONCURRENCY: must be a positive number, got "0"`},
		{"BadValidity", map[string]string{"SMS_VALIDITY": "verify_code=5"}, []string{"run"},
			`worker: SMS_VALIDITY: verify_code: invalid duration "5" (use 30s, 5m, 2h)`},
		{"HugeValidity", map[string]string{"SMS_VALIDITY": "verify_code=5m,login_code=200h"}, []string{"dev"},
			`worker: SMS_VALIDITY: login_code: must be from 1s to 168h, got "200h"`},
		{"ValidityTwice", nil, []string{"run", "--sms-validity", "t=1m,t=2m"},
			`worker: --sms-validity: t is given twice`},
		{"BadRecipientLimit", nil, []string{"run", "--sms-recipient-limit", "verify_code=1/1m;5"},
			`worker: --sms-recipient-limit: verify_code: want COUNT/PERIOD (1/1m), got "5"`},
		{"HugeRecipientLimit", map[string]string{"SMS_RECIPIENT_LIMIT": "verify_code=100000/1h"}, []string{"demo"},
			`worker: SMS_RECIPIENT_LIMIT: verify_code: a count must be from 1 to 10000, got "100000"`},
		{"TokenWithoutURL", map[string]string{"SMS_PROVIDER_TOKEN": "tok"}, []string{"run"},
			`worker: SMS_PROVIDER_TOKEN: set without SMS_PROVIDER_URL`},
		{"TokenWithSpace", map[string]string{"SMS_PROVIDER_URL": "https://sms.example/send",
			"SMS_PROVIDER_TOKEN": "s3cret token"}, []string{"run"},
			`worker: SMS_PROVIDER_TOKEN: must be printable ASCII without spaces`},
		{"UnknownSignature", map[string]string{"PAYMENT_SIGNATURE": "stripe"}, []string{"run"},
			`worker: PAYMENT_SIGNATURE: unknown scheme "stripe" (use off or standard-webhooks)`},
		{"SignatureWithoutKeys", map[string]string{"PAYMENT_SIGNATURE": "standard-webhooks"}, []string{"run"},
			`worker: PAYMENT_SIGNING_KEYS: required with PAYMENT_SIGNATURE standard-webhooks`},
		{"KeysWithoutSignature", map[string]string{"PAYMENT_SIGNING_KEYS": "p:whsec_MDEyMzQ1Njc4OWFiY2RlZg=="}, []string{"run"},
			`worker: PAYMENT_SIGNING_KEYS: set with PAYMENT_SIGNATURE off: callbacks would not be verified (set PAYMENT_SIGNATURE standard-webhooks)`},
		{"ShortSigningKey", map[string]string{"PAYMENT_SIGNATURE": "standard-webhooks",
			"PAYMENT_SIGNING_KEYS": "p:whsec_c2hvcnQ="}, []string{"run"},
			`worker: PAYMENT_SIGNING_KEYS: key p: a secret of 5 bytes: use 16 to 512`},
		{"SigningKeyTwice", nil, []string{"run", "--payment-signature=standard-webhooks",
			"--payment-signing-keys=p:whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=,p:whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ="},
			`worker: --payment-signing-keys: key p is given twice`},
		{"HugeSignatureTolerance", map[string]string{"PAYMENT_SIGNATURE_TOLERANCE": "48h"}, []string{"run"},
			`worker: PAYMENT_SIGNATURE_TOLERANCE: must be from 1s to 24h, got "48h"`},
		{"StatusTokenWithoutURL", map[string]string{"PAYMENT_STATUS_TOKEN": "tok"}, []string{"run"},
			`worker: PAYMENT_STATUS_TOKEN: set without PAYMENT_STATUS_URL`},
		{"BadStatusURL", map[string]string{"PAYMENT_STATUS_URL": "ftp://u:tok@psp/status"}, []string{"run"},
			`worker: PAYMENT_STATUS_URL: want an absolute http:// or https:// URL`},
		{"ReconcileAfterMaxAge", map[string]string{"RECONCILE_AFTER": "2h", "RECONCILE_MAX_AGE": "1h"}, []string{"run"},
			`worker: RECONCILE_AFTER: 2h0m0s is not less than RECONCILE_MAX_AGE 1h0m0s`},
		{"HugeReconcileMaxAge", map[string]string{"RECONCILE_MAX_AGE": "9000h"}, []string{"run"},
			`worker: RECONCILE_MAX_AGE: must be from 1m to 8760h, got "9000h"`},
		{"BadLogLevel", map[string]string{"LOG_LEVEL": "loud"}, []string{"run"},
			`worker: LOG_LEVEL: invalid level "loud" (use debug, info, warn or error)`},
		{"BadLogFormat", map[string]string{"LOG_FORMAT": "xml"}, []string{"dev"},
			`worker: LOG_FORMAT: invalid format "xml" (use json or text)`},
		{"BadLogOutcomes", map[string]string{"LOG_OUTCOMES": "some"}, []string{"run"},
			`worker: LOG_OUTCOMES: invalid boolean "some" (use true or false)`},
		{"BadHTTPAddr", map[string]string{"HTTP_ADDR": "8080"}, []string{"run"},
			`worker: HTTP_ADDR: invalid address "8080" (use host:port)`},
		{"BadDevAddr", map[string]string{"DEV_KAFKA_ADDR": "127.0.0.1:99999"}, []string{"dev"},
			`worker: DEV_KAFKA_ADDR: invalid port in "127.0.0.1:99999"`},
		{"MigrateSubcommand", nil, []string{"migrate", "down"},
			`worker: unknown migrate subcommand "down" (want: worker migrate, or worker migrate status)`},
		{"ExtraArgument", nil, []string{"run", "now"},
			`worker: unexpected argument "now" (see worker run --help)`},
		{"NoCommand", nil, nil,
			`worker: no command given (run, migrate, dev, demo, replay, parked, inspect); see worker --help`},
		{"UnknownCommand", nil, []string{"serve"},
			`worker: unknown command "serve" (run, migrate, dev, demo, replay, parked, inspect); see worker --help`},
		{"FlagBeforeCommand", nil, []string{"--kafka-brokers=x:1", "run"},
			`worker: flags go after the command: worker CMD --kafka-brokers=x:1; see worker --help`},

		// Absurd values, refused before anything is connected to.
		{"HugeMaxInFlight", map[string]string{"MAX_IN_FLIGHT": "100000000"}, []string{"run"},
			`worker: MAX_IN_FLIGHT: must be from 1 to 10000, got "100000000"`},
		{"TinyLagInterval", map[string]string{"LAG_INTERVAL": "1ns"}, []string{"run"},
			`worker: LAG_INTERVAL: must be from 100ms to 10m, got "1ns"`},
		{"TinySessionTimeout", map[string]string{"KAFKA_SESSION_TIMEOUT": "1ms"}, []string{"run"},
			`worker: KAFKA_SESSION_TIMEOUT: must be from 500ms to 30m, got "1ms"`},
		{"HugeSessionTimeoutFlag", nil, []string{"dev", "--kafka-session-timeout=1h"},
			`worker: --kafka-session-timeout: must be from 500ms to 30m, got "1h"`},
		{"TinyRetryInitialInterval", map[string]string{"RETRY_INITIAL_INTERVAL": "1ns"}, []string{"run"},
			`worker: RETRY_INITIAL_INTERVAL: must be from 10ms to 1m, got "1ns"`},
		{"HugeRetryMaxInterval", map[string]string{"RETRY_MAX_INTERVAL": "1000h"}, []string{"run"},
			`worker: RETRY_MAX_INTERVAL: must be from 10ms to 1h, got "1000h"`},
		{"TinyRetryMaxElapsed", map[string]string{"RETRY_MAX_ELAPSED": "1ms"}, []string{"run"},
			`worker: RETRY_MAX_ELAPSED: must be from 100ms to 168h, got "1ms"`},
		{"TinyRetryParkAfter", map[string]string{"RETRY_PARK_AFTER": "1ns"}, []string{"run"},
			`worker: RETRY_PARK_AFTER: must be from 100ms to 1h, got "1ns"`},
		{"TinyInboxRetention", map[string]string{"INBOX_RETENTION_PAYMENTS": "1m"}, []string{"run"},
			`worker: INBOX_RETENTION_PAYMENTS: must be from 1h to 87600h, got "1m"`},
		{"HugeInboxRetention", map[string]string{"INBOX_RETENTION_SMS": "100000h"}, []string{"run"},
			`worker: INBOX_RETENTION_SMS: must be from 1h to 87600h, got "100000h"`},
		{"HugeBatchSize", map[string]string{"BATCH_SIZE": "1000000"}, []string{"run"},
			`worker: BATCH_SIZE: must be from 1 to 10000, got "1000000"`},
		{"HugeBatchWait", map[string]string{"BATCH_WAIT": "1h"}, []string{"run"},
			`worker: BATCH_WAIT: must be from 1ms to 1s, got "1h"`},
		{"HugePaymentsConcurrency", map[string]string{"PAYMENTS_CONCURRENCY": "100000"}, []string{"run"},
			`worker: PAYMENTS_CONCURRENCY: must be from 1 to 1000, got "100000"`},
		{"HugeSMSConcurrency", map[string]string{"SMS_CONCURRENCY": "1000000"}, []string{"run"},
			`worker: SMS_CONCURRENCY: must be from 1 to 10000, got "1000000"`},
		{"TinyShutdownTimeout", map[string]string{"SHUTDOWN_TIMEOUT": "10ms"}, []string{"run"},
			`worker: SHUTDOWN_TIMEOUT: must be from 1s to 1h, got "10ms"`},
		{"TinyStartupTimeout", map[string]string{"STARTUP_TIMEOUT": "1ns"}, []string{"migrate"},
			`worker: STARTUP_TIMEOUT: must be from 100ms to 1h, got "1ns"`},
		{"DeadLetterLoop", map[string]string{"TOPIC_SMS": "payments.callbacks.dlq"}, []string{"run"},
			`worker: TOPIC_SMS: "payments.callbacks.dlq" is the dead-letter topic of TOPIC_PAYMENTS (DLQ_SUFFIX ".dlq")`},
		{"DeadLetterTopicTooLong", map[string]string{"TOPIC_PAYMENTS": strings.Repeat("p", 248)}, []string{"run"},
			`worker: DLQ_SUFFIX: TOPIC_PAYMENTS + DLQ_SUFFIX is 252 characters, more than a topic name's 249`},
	}
	// Nothing must be reached should a check above let its value through: no database, no broker.
	unreachable := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "STARTUP_TIMEOUT": "100ms",
		"KAFKA_BROKERS": "127.0.0.1:1"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env := maps.Clone(unreachable)
			maps.Copy(env, tt.env)
			r := runMain(t, env, tt.args...)
			if r.code != 1 || r.stdout != "" || r.stderr != tt.want+"\n" {
				t.Errorf("got exit %d, stdout %q, stderr %q; want exit 1 and stderr %q", r.code, r.stdout, r.stderr, tt.want)
			}
			if strings.Contains(r.stderr, "s3cret") || strings.Contains(r.stderr, "tok@") {
				t.Errorf("a secret leaked: %q", r.stderr)
			}
		})
	}
}

// contractDefaults are the defaults of the contract's configuration table.
var contractDefaults = map[string]string{
	"KAFKA_BROKERS":                  "127.0.0.1:9092",
	"KAFKA_GROUP_ID":                 "inboxworker",
	"KAFKA_SESSION_TIMEOUT":          "10s",
	"KAFKA_SASL_MECHANISM":           "",
	"KAFKA_USERNAME":                 "",
	"KAFKA_PASSWORD":                 "",
	"KAFKA_TLS":                      "false",
	"DATABASE_URL":                   "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
	"TOPIC_PAYMENTS":                 "payments.callbacks",
	"TOPIC_SMS":                      "notifications.sms",
	"DLQ_SUFFIX":                     ".dlq",
	"PAYMENT_SIGNATURE":              "off", // this round
	"PAYMENT_SIGNING_KEYS":           "",
	"PAYMENT_SIGNATURE_TOLERANCE":    "5m",
	"PAYMENT_STATUS_URL":             "",
	"PAYMENT_STATUS_TOKEN":           "",
	"PAYMENT_STATUS_RATE_LIMIT":      "10",
	"RECONCILE_AFTER":                "10m",
	"RECONCILE_MAX_AGE":              "72h",
	"SMS_PROVIDER_URL":               "",
	"SMS_PROVIDER_TOKEN":             "",
	"SMS_VALIDITY":                   "", // this round: no expiry
	"SMS_RECIPIENT_LIMIT":            "", // this round: no limit
	"RETRY_INITIAL_INTERVAL":         "200ms",
	"SMS_PROVIDER_TIMEOUT":           "10s", // not in the contract's table: how long the gateway may take
	"RETRY_MAX_INTERVAL":             "30s",
	"RETRY_MAX_ELAPSED":              "5m",
	"RETRY_PARK_AFTER":               "5s", // not in the contract's table: the park's
	"KILL_SWITCH_AFTER":              "10", // not in the contract's table: the kill switch's
	"KILL_SWITCH_RATE":               "50",
	"KILL_SWITCH_MAX_PROBE_INTERVAL": "30s",
	"INBOX_RETENTION_PAYMENTS":       "", // the topic's retention.ms + segment.ms + 1h, settled at start
	"INBOX_RETENTION_SMS":            "",
	"BATCH_SIZE":                     "256", // not in the contract's table: the throughput settings
	"BATCH_WAIT":                     "5ms",
	"LAG_INTERVAL":                   "5s", // how often consumer_lag is refreshed
	"ORDERING":                       "key",
	"MAX_IN_FLIGHT":                  "256",
	"PAYMENTS_CONCURRENCY":           "4",
	"SMS_CONCURRENCY":                "128",
	"OFFSET_COMMIT_FAILURE_TIMEOUT":  "1m", // how long failing commits are borne before /readyz says 503
	"SMS_RATE_LIMIT":                 "",   // none
	"TOPIC_PAYMENT_EVENTS":           "payments.events",
	"INBOX_RETENTION_PAYMENT_EVENTS": "",
	"PAYMENT_EVENTS_CONCURRENCY":     "4",
	"OUTBOX_RETENTION":               "24h",
	"HTTP_ADDR":                      ":8080",
	"SHUTDOWN_TIMEOUT":               "30s",
	"STARTUP_TIMEOUT":                "15s",
	"LOG_LEVEL":                      "info",
	"LOG_FORMAT":                     "json",
	"DEV_KAFKA_ADDR":                 "127.0.0.1:9092",
	"LOG_OUTCOMES":                   "true", // not in the contract's table: a line per applied payment
	"OUTBOX_RELAY":                   "true", // not in the contract's table: false leaves the outbox to Debezium
	"DEV_TOPICS":                     "",     // not in the contract's table: worker dev's topics of a team's own routes
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	for _, s := range settingsOf(bundledRoutes) {
		if s.Env == "" {
			continue
		}
		want, ok := contractDefaults[s.Env]
		if !ok {
			t.Errorf("%s is not in the contract", s.Env)
		}
		if s.Default != want {
			t.Errorf("%s defaults to %q, the contract says %q", s.Env, s.Default, want)
		}
	}
	cfg := parseConfig(t, nil, "run")
	want := settings.Config{
		KafkaBrokers: []string{"127.0.0.1:9092"}, KafkaGroupID: "inboxworker", KafkaSessionTimeout: 10 * time.Second,
		DatabaseURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Routes: map[string]*settings.RouteSettings{
			paymentsInbox:      {Topic: "payments.callbacks", Concurrency: 4},
			smsInbox:           {Topic: "notifications.sms", Concurrency: 128},
			paymentEventsInbox: {Topic: "payments.events", Concurrency: 4},
		},
		OutboxRetention: 24 * time.Hour, OutboxRelay: true, SMSProviderTimeout: 10 * time.Second,
		PaymentSignature: "off", PaymentSignatureTolerance: 5 * time.Minute,
		PaymentStatusRateLimit: 10, ReconcileAfter: 10 * time.Minute, ReconcileMaxAge: 72 * time.Hour,
		DLQSuffix:            ".dlq",
		RetryInitialInterval: 200 * time.Millisecond, RetryMaxInterval: 30 * time.Second, RetryMaxElapsed: 5 * time.Minute, RetryParkAfter: 5 * time.Second,
		KillSwitchAfter: 10, KillSwitchRate: 50, KillSwitchMaxProbeInterval: 30 * time.Second,
		BatchSize: 256, BatchWait: 5 * time.Millisecond, LagInterval: 5 * time.Second, CommitFailureTimeout: time.Minute,
		Ordering: "key", MaxInFlight: 256,
		HTTPAddr: ":8080", ShutdownTimeout: 30 * time.Second, StartupTimeout: 15 * time.Second,
		LogLevel: slog.LevelInfo, LogFormat: "json", LogOutcomes: true, DevKafkaAddr: "127.0.0.1:9092",
	}
	for name, r := range want.Routes {
		if got := *cfg.Route(name); got != *r {
			t.Errorf("route %s defaults to %+v, want %+v", name, got, *r)
		}
	}
	got := *cfg.Config
	got.Routes, want.Routes = nil, nil
	if got, want := exportedFields(got), exportedFields(want); got != want {
		t.Errorf("defaults:\n got %s\nwant %s", got, want)
	}
}

// exportedFields is c's exported fields and their values, as %+v prints them.
func exportedFields(c settings.Config) string {
	v := reflect.ValueOf(c)
	var b strings.Builder
	for i := range v.NumField() {
		if f := v.Type().Field(i); f.IsExported() {
			fmt.Fprintf(&b, "%s:%+v ", f.Name, v.Field(i).Interface())
		}
	}
	return b.String()
}

// parseConfig resolves the configuration of command from env and args as Main would.
func parseConfig(t *testing.T, env map[string]string, command string, args ...string) *Config {
	t.Helper()
	fs := envflag.NewSet(command, findCommand(command).selected(settingsOf(bundledRoutes)))
	if _, err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	cfg, err := resolve(fs, func(k string) string { return env[k] }, bundledRoutes, settingsOf(bundledRoutes))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestFlagWinsOverEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"RETRY_MAX_ELAPSED": "1m", "KAFKA_BROKERS": "a:1, b:2", "KAFKA_TLS": "true",
		"SMS_PROVIDER_URL": "http://sms.local/send"}
	tests := []struct {
		name string
		args []string
		want func(*Config) bool
	}{
		{"EnvAlone", nil, func(c *Config) bool {
			return c.RetryMaxElapsed == time.Minute && strings.Join(c.KafkaBrokers, ",") == "a:1,b:2" && c.KafkaTLS
		}},
		{"FlagWins", []string{"--retry-max-elapsed=2m", "--kafka-brokers", "c:3"}, func(c *Config) bool {
			return c.RetryMaxElapsed == 2*time.Minute && strings.Join(c.KafkaBrokers, ",") == "c:3"
		}},
		{"BoolFlagOff", []string{"--kafka-tls=false"}, func(c *Config) bool { return !c.KafkaTLS }},
		{"EmptyFlagUnsets", []string{"--sms-provider-url="}, func(c *Config) bool { return c.SMSProviderURL == "" }},
		{"NoMigrate", []string{"--no-migrate"}, func(c *Config) bool { return c.NoMigrate }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if cfg := parseConfig(t, env, "run", tt.args...); !tt.want(cfg) {
				t.Errorf("unexpected configuration %+v", cfg)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	t.Run("Overview", func(t *testing.T) {
		t.Parallel()
		r := runMain(t, nil, "--help")
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
		}
		for _, c := range commands() {
			if !strings.Contains(r.stdout, "  "+c.name+" ") {
				t.Errorf("--help does not list command %s", c.name)
			}
		}
		checkFlagsListed(t, r.stdout, settingsOf(nil), nil)
	})
	for _, c := range commands() {
		t.Run(strings.ToUpper(c.name[:1])+c.name[1:], func(t *testing.T) {
			t.Parallel()
			r := runMain(t, nil, c.name, "--help")
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if !strings.HasPrefix(r.stdout, "Usage: worker "+c.name) {
				t.Errorf("no usage line:\n%s", r.stdout)
			}
			checkFlagsListed(t, r.stdout, c.selected(settingsOf(bundledRoutes)), c.defaults)
			if same := runMain(t, nil, "help", c.name); same.stdout != r.stdout {
				t.Errorf("worker help %s differs from worker %s --help", c.name, c.name)
			}
		})
	}
}

func checkFlagsListed(t *testing.T, help string, ss []*settings.Var, defaults map[string]string) {
	t.Helper()
	for _, s := range ss {
		line := ""
		for l := range strings.Lines(help) {
			if strings.HasPrefix(l, "  --"+s.Flag+" ") {
				line = l
			}
		}
		switch {
		case line == "":
			t.Errorf("--%s is not described", s.Flag)
		case s.Env != "" && !strings.Contains(line, "env "+s.Env):
			t.Errorf("--%s does not name %s: %q", s.Flag, s.Env, line)
		case defaults[s.Env] != "" && !strings.Contains(line, "default "+defaults[s.Env]):
			t.Errorf("--%s does not give the command's default %q: %q", s.Flag, defaults[s.Env], line)
		case defaults[s.Env] == "" && s.Default != "" && !strings.Contains(line, fmt.Sprintf("default %q", s.Default)):
			t.Errorf("--%s does not give its default %q: %q", s.Flag, s.Default, line)
		}
	}
}

func TestStartupLogMasksSecrets(t *testing.T) {
	t.Parallel()
	cfg := parseConfig(t, map[string]string{
		"DATABASE_URL":         "postgres://app:db-s3cret@db/shop",
		"KAFKA_SASL_MECHANISM": "scram-sha-512", "KAFKA_USERNAME": "app", "KAFKA_PASSWORD": "kafka-s3cret",
		"SMS_PROVIDER_URL": "https://sms.example/send", "SMS_PROVIDER_TOKEN": "token-s3cret",
	}, "run")
	cfg.Use(findCommand("run").selected(settingsOf(bundledRoutes)))
	var out bytes.Buffer
	logStart(context.Background(), slog.New(slog.NewJSONHandler(&out, nil)), "run", cfg)
	if strings.Contains(out.String(), "s3cret") {
		t.Errorf("a secret leaked into the startup line: %s", out.String())
	}
	for _, want := range []string{`"DATABASE_URL":"postgres://app:xxxxx@db/shop"`, `"KAFKA_PASSWORD":"xxxxx"`,
		`"SMS_PROVIDER_TOKEN":"xxxxx"`, `"KAFKA_SASL_MECHANISM":"SCRAM-SHA-512"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the startup line lacks %s: %s", want, out.String())
		}
	}
}

// TestEverySettingIsRead checks that every setting of the table is read by a command: a setting
// no command binds is silently ignored, its variable and its flag alike (LAG_INTERVAL was, while
// each command listed its settings by name).
func TestEverySettingIsRead(t *testing.T) {
	t.Parallel()
	read := map[string]bool{}
	all := settingsOf(bundledRoutes)
	for _, c := range commands() {
		for _, s := range c.selected(all) {
			read[s.Env+s.Flag] = true
		}
	}
	for _, s := range all {
		if !read[s.Env+s.Flag] {
			t.Errorf("no command reads %s (--%s)", s.Env, s.Flag)
		}
	}
	if cfg := parseConfig(t, map[string]string{"LAG_INTERVAL": "100ms"}, "run"); cfg.LagInterval != 100*time.Millisecond {
		t.Errorf("worker run: LAG_INTERVAL=100ms gives %s", cfg.LagInterval)
	}
}

// TestSMSTrafficSettings: SMS_VALIDITY and SMS_RECIPIENT_LIMIT reach the SMS route's handler as
// parsed, and the startup line shows them as given.
func TestSMSTrafficSettings(t *testing.T) {
	t.Parallel()
	cfg := parseConfig(t, map[string]string{"SMS_VALIDITY": "verify_code=5m, login_code=2m"}, "run",
		"--sms-recipient-limit=verify_code=10/24h;1/1m;5/1h")
	if got := cfg.SMSValidity.String(); got != "login_code=2m,verify_code=5m" {
		t.Errorf("SMSValidity = %s", got)
	}
	if got := cfg.SMSRecipientLimits.String(); got != "verify_code=1/1m;5/1h;10/24h" {
		t.Errorf("SMSRecipientLimits = %s", got)
	}
	if shown := cfg.Shown("SMS_RECIPIENT_LIMIT"); shown != "verify_code=10/24h;1/1m;5/1h" {
		t.Errorf("the startup line shows %q", shown)
	}
	if cfg := parseConfig(t, nil, "run"); cfg.SMSValidity != nil || cfg.SMSRecipientLimits != nil {
		t.Errorf("unset: %v, %v; want none", cfg.SMSValidity, cfg.SMSRecipientLimits)
	}
}

// TestSigningKeysShown: the startup line shows the signing keys' names, never a key.
func TestSigningKeysShown(t *testing.T) {
	t.Parallel()
	const secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQ="
	cfg := parseConfig(t, map[string]string{"PAYMENT_SIGNATURE": "standard-webhooks",
		"PAYMENT_SIGNING_KEYS": "old:whsec_" + secret + ", new:whsec_" + secret}, "run")
	if got := strings.Join(cfg.PaymentSigningKeys.Names(), ","); got != "old,new" {
		t.Errorf("keys %s, want old,new", got)
	}
	if shown := cfg.Shown("PAYMENT_SIGNING_KEYS"); shown != "old,new" {
		t.Errorf("the startup line shows %q, want the names alone", shown)
	}
}

// TestKillSwitchSettings: the KILL_SWITCH_* settings reach the worker's kill switch, the rate as a
// share.
func TestKillSwitchSettings(t *testing.T) {
	t.Parallel()
	cfg := parseConfig(t, map[string]string{"KILL_SWITCH_AFTER": "5", "KILL_SWITCH_RATE": "20"}, "run",
		"--kill-switch-max-probe-interval=2m")
	want := inboxworker.KillSwitch{After: 5, Rate: 0.2, MaxProbeInterval: 2 * time.Minute}
	if got := cfg.killSwitch(); got != want {
		t.Errorf("kill switch = %+v, want %+v", got, want)
	}
}
