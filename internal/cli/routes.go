package cli

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/inspect"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/receipt"
	"github.com/inboxworker/inboxworker/internal/signature"
	"github.com/inboxworker/inboxworker/internal/startup"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// A routeRow is one route of the binary, and all there is to it: its settings (its topic, how long
// its keys are remembered, how many of its handlers run at once), the check of its topic at start,
// its topics in worker dev and worker demo, and how its handler is built, are derived from the row.
// A third route is a package with its handler and a row in bundledRoutes.
type routeRow struct {
	// name is the route's name in the inbox, and the stem of its settings: TOPIC_<NAME>,
	// INBOX_RETENTION_<NAME>, <NAME>_CONCURRENCY.
	name string
	// topic is its topic's default; what its messages are, for the settings' help.
	topic, what string
	// concurrency is the default of <NAME>_CONCURRENCY, and concurrencyHelp its help.
	concurrency     int
	concurrencyHelp string
	// maxConcurrency bounds <NAME>_CONCURRENCY.
	maxConcurrency int
	// handler builds the route's handler: its Handler or its Call, of the route it returns.
	handler func(cfg *Config, deps routeDeps) (inboxworker.Route, error)
	// calls: its handler is a call handler, whose calls <NAME>_RATE_LIMIT bounds.
	calls bool
	// optional: its topic may be "-", which turns the route off; and it is consumed only when its
	// topic is set, or by worker dev and worker demo, which create it: a consumer group one of whose
	// topics does not exist consumes none of them, so a default must not name a topic that may not
	// exist yet.
	optional bool
	// inspect says which business tables worker inspect reads for the route (zero: the inbox's
	// own only).
	inspect inspect.Kind
}

// bundledRoutes are the binary's routes.
var bundledRoutes = []routeRow{
	{name: paymentsInbox, topic: "payments.callbacks", what: "payment callback",
		concurrency: 4, maxConcurrency: 1000,
		concurrencyHelp: "most payment transactions (batches) at once, across partitions; each holds a database connection",
		inspect:         inspect.Payments,
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			h, err := payment.NewHandler(payment.Config{EventsTopic: cfg.topic(paymentEventsInbox), Logger: deps.logger,
				AppliedLevel: outcomeLevel(cfg)})
			if err != nil {
				return inboxworker.Route{}, err
			}
			verify, err := paymentVerifier(cfg, deps.logger)
			return inboxworker.Route{Handler: h, Verify: verify}, err
		}},
	{name: smsInbox, topic: "notifications.sms", what: "SMS event", calls: true,
		concurrency: 128, maxConcurrency: 10000,
		concurrencyHelp: "most SMS being sent at once, across partitions",
		inspect:         inspect.SMS,
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			sender, err := smsSender(cfg, deps.logger, deps.tracer)
			if err != nil {
				return inboxworker.Route{}, err
			}
			lease := smsCallLease(cfg)
			h, err := notify.NewHandler(notify.Config{Sender: sender, Validity: cfg.SMSValidity,
				RecipientLimits: cfg.SMSRecipientLimits, Hold: 2 * lease, Pool: deps.pool, Logger: deps.logger})
			return inboxworker.Route{Call: h, CallLease: lease}, err
		}},
	// The order events the payment route emits, also where the outbox relay publishes them
	// (TOPIC_PAYMENT_EVENTS; "-": no events are emitted): an order paid asks for the customer's
	// payment-received SMS, through the outbox, to the SMS route.
	{name: paymentEventsInbox, topic: "payments.events", what: "order event", optional: true,
		concurrency: 4, maxConcurrency: 1000,
		concurrencyHelp: "most order-event transactions (batches) at once, across partitions",
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			h, err := receipt.NewHandler(receipt.Config{SMSTopic: cfg.topic(smsInbox), Logger: deps.logger})
			return inboxworker.Route{Handler: h}, err
		}},
}

// paymentVerifier verifies the payment callbacks as PAYMENT_SIGNATURE says; nil, said once at start,
// when they are not verified.
func paymentVerifier(cfg *Config, logger *slog.Logger) (inboxworker.Verifier, error) {
	if cfg.PaymentSignature != "standard-webhooks" {
		logger.Info("payment callbacks are not verified (PAYMENT_SIGNATURE off): whoever can produce to the topic can pay an order",
			"topic", cfg.topic(paymentsInbox))
		return nil, nil
	}
	v, err := signature.NewVerifier(cfg.PaymentSigningKeys, cfg.PaymentSignatureTolerance)
	if err != nil {
		return nil, err
	}
	logger.Info("payment callbacks are verified (Standard Webhooks)", "topic", cfg.topic(paymentsInbox),
		"keys", strings.Join(cfg.PaymentSigningKeys.Names(), ","), "tolerance", cfg.PaymentSignatureTolerance.String())
	return v, nil
}

// smsCallLease is the SMS route's lease on a key while its send is out: twice SMS_PROVIDER_TIMEOUT.
// The send gets two thirds of the lease, so the provider's timeout ends it first, with its own
// error; the rest covers a send the provider may still be working on after the worker gave up on
// it, during which no other send of the key starts. 0 (no timeout set): the route's default.
func smsCallLease(cfg *Config) time.Duration { return 2 * cfg.SMSProviderTimeout }

// outcomeLevel is the level of the line logged for each message applied: info, unless LOG_OUTCOMES
// is false.
func outcomeLevel(cfg *Config) slog.Level {
	if cfg.LogOutcomes {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// The inbox names of the bundled routes, which the demo's summary reads.
const (
	paymentsInbox      = "payments"
	smsInbox           = "sms"
	paymentEventsInbox = "payment_events"
)

// routeSettings are a route's settings, as its row derives them.
type routeSettings struct {
	Topic string
	// Retention is how long its idempotency keys are remembered. Zero (the default) means "as long
	// as the topic can redeliver": settled at start from the topic's configuration (see checkKafka).
	Retention   time.Duration
	Concurrency int
	// RateLimit is the most calls per second of a call route, for the whole group; 0: none.
	RateLimit int
}

// route returns the settings of the route named name, made when first asked for.
func (c *Config) route(name string) *routeSettings {
	if c.Routes == nil {
		c.Routes = map[string]*routeSettings{}
	}
	if c.Routes[name] == nil {
		c.Routes[name] = &routeSettings{}
	}
	return c.Routes[name]
}

// topic returns the topic of the route named name.
func (c *Config) topic(name string) string { return c.route(name).Topic }

// settingsOf is the settings of the binary with routes: those of the table settings, each route's
// after DATABASE_URL, in the order of routes.
func settingsOf(routes []routeRow) []*setting {
	var out []*setting
	for _, s := range settings {
		out = append(out, s)
		if s.Env == "DATABASE_URL" {
			for _, r := range routes {
				out = append(out, r.settings()...)
			}
		}
	}
	return out
}

// settings are r's settings: its topic, its inbox retention, its concurrency and, for a call route,
// its rate limit.
func (r routeRow) settings() []*setting {
	stem := strings.ToUpper(r.name)
	flag := strings.ReplaceAll(r.name, "_", "-")
	out := []*setting{
		{Env: "TOPIC_" + stem, Flag: "topic-" + flag, Default: r.topic, Meta: "TOPIC", Use: useTopics | useInspect,
			Usage: r.topicHelp(),
			Set: func(c *Config, v string) error {
				if r.optional && (v == "-" || v == "") {
					c.route(r.name).Topic = ""
					return nil
				}
				return parseTopic(&c.route(r.name).Topic, v)
			}},
		{Env: "INBOX_RETENTION_" + stem, Flag: "inbox-retention-" + flag, Meta: "DURATION", Use: useWorker,
			Shown: settledFromTopic,
			Usage: "how long a " + r.what + "'s idempotency key is remembered " +
				"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
			Bound: retentionBound,
			Set: func(c *Config, v string) error {
				return envflag.OptionalDuration(&c.route(r.name).Retention, v)
			}},
		{Env: stem + "_CONCURRENCY", Flag: flag + "-concurrency", Default: fmt.Sprint(r.concurrency), Meta: "N",
			Use: useWorker, Usage: r.concurrencyHelp, Bound: envflag.Counts(1, r.maxConcurrency),
			Set: func(c *Config, v string) error { return envflag.Positive(&c.route(r.name).Concurrency, v) }},
	}
	if r.calls {
		out = append(out, &setting{Env: stem + "_RATE_LIMIT", Flag: flag + "-rate-limit", Meta: "N", Use: useWorker,
			Usage: "most calls per second of the " + r.name + " route for the whole consumer group, each instance " +
				"taking the share of the partitions it owns (unset: none)",
			Bound: envflag.Counts(1, 100000),
			Set:   func(c *Config, v string) error { return envflag.Limit(&c.route(r.name).RateLimit, v) }})
	}
	return out
}

// topicHelp is the help of r's topic setting.
func (r routeRow) topicHelp() string {
	if r.optional {
		return r.what + " topic (- turns the route off; consumed when set, and by worker dev and demo)"
	}
	return r.what + " topic"
}

// active are the routes the worker consumes: every route, but an optional one that is off, or
// whose topic was not set outside worker dev and worker demo.
func (c *Config) active() []routeRow {
	var out []routeRow
	for _, r := range c.routes {
		if !r.optional || c.topic(r.name) != "" && (c.receipts || c.explicit("TOPIC_"+strings.ToUpper(r.name))) {
			out = append(out, r)
		}
	}
	return out
}

// checkTopics checks the routes' topics and their dead-letter topics against one another: no two
// routes on one topic, and no route consuming another's dead letters.
func (c *Config) checkTopics(fail func(env, format string, args ...any) error) error {
	for i, r := range c.routes {
		t, env := c.topic(r.name), "TOPIC_"+strings.ToUpper(r.name)
		if t == "" {
			continue // an optional route, off
		}
		if n := len(t + c.DLQSuffix); n > startup.MaxTopicName {
			return fail("DLQ_SUFFIX", "%s + DLQ_SUFFIX is %d characters, more than a topic name's %d",
				env, n, startup.MaxTopicName)
		}
		for _, o := range c.routes[:i] {
			other, otherEnv := c.topic(o.name), "TOPIC_"+strings.ToUpper(o.name)
			switch {
			case t == other:
				return fail(env, "must differ from %s (both are %q)", otherEnv, t)
			case other == t+c.DLQSuffix:
				return fail(otherEnv, "%q is the dead-letter topic of %s (DLQ_SUFFIX %q)", other, env, c.DLQSuffix)
			case t == other+c.DLQSuffix:
				return fail(env, "%q is the dead-letter topic of %s (DLQ_SUFFIX %q)", t, otherEnv, c.DLQSuffix)
			}
		}
	}
	return nil
}

// topics are the topics of the routes the worker consumes.
func (c *Config) topics() []string {
	var out []string
	for _, r := range c.active() {
		out = append(out, c.topic(r.name))
	}
	return out
}

// devTopics are the topics worker dev and worker demo create: those consumed and those emitted to.
func (c *Config) devTopics() []string {
	out := c.topics()
	for _, t := range c.emittedTopics() {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// emittedTopics are the topics the routes emit events to through the outbox: the order events', and
// the SMS topic for the payment-received SMS; none while emission is off.
func (c *Config) emittedTopics() []string {
	if c.topic(paymentEventsInbox) == "" {
		return nil
	}
	return []string{c.topic(paymentEventsInbox), c.topic(smsInbox)}
}

// routeDeps are what the routes' handlers are built with: the worker's logger, its tracer of what
// they call, and its pool (nil where none is open yet).
type routeDeps struct {
	logger *slog.Logger
	tracer *tracing.Tracer
	pool   *pgxpool.Pool
}

// workerRoutes are the routes as the worker takes them, their handlers built with deps.
func (c *Config) workerRoutes(deps routeDeps) ([]inboxworker.Route, error) {
	var out []inboxworker.Route
	for _, r := range c.active() {
		route, err := r.handler(c, deps)
		if err != nil {
			return nil, err
		}
		s := c.route(r.name)
		route.Topic, route.Name, route.Retention, route.Concurrency = s.Topic, r.name, s.Retention, s.Concurrency
		route.RateLimit = float64(s.RateLimit)
		out = append(out, route)
	}
	return out, nil
}
