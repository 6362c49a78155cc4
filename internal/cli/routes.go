package cli

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/inspect"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
	"github.com/inboxworker/inboxworker/internal/receipt"
	"github.com/inboxworker/inboxworker/internal/settings"
	"github.com/inboxworker/inboxworker/internal/signature"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// A routeRow is one route of the binary, and all there is to it: its settings (settings.Route:
// its topic, how long its keys are remembered, how many of its handlers run at once), the check of
// its topic at start, its topics in worker dev and worker demo, and how its handler is built, are
// derived from the row. A third route is a package with its handler and a row in bundledRoutes.
type routeRow struct {
	settings.Route
	// handler builds the route's handler: its Handler or its Call, of the route it returns.
	handler func(cfg *Config, deps routeDeps) (inboxworker.Route, error)
	// inspect says which business tables worker inspect reads for the route (zero: the inbox's
	// own only).
	inspect inspect.Kind
}

// Config is the worker's configuration (package settings) with the binary's routes, whose
// handlers it builds.
type Config struct {
	*settings.Config
	routes []routeRow
}

// bundledRoutes are the binary's routes.
var bundledRoutes = []routeRow{
	{Route: settings.Route{Name: paymentsInbox, Topic: "payments.callbacks", What: "payment callback",
		Concurrency: 4, MaxConcurrency: 1000,
		ConcurrencyHelp: "most payment transactions (batches) at once, across partitions; each holds a database connection"},
		inspect: inspect.Payments,
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			h, err := payment.NewHandler(payment.Config{EventsTopic: cfg.Topic(paymentEventsInbox), Logger: deps.logger,
				AppliedLevel: cfg.OutcomeLevel()})
			if err != nil {
				return inboxworker.Route{}, err
			}
			verify, err := paymentVerifier(cfg, deps.logger)
			return inboxworker.Route{Handler: h, Verify: verify}, err
		}},
	{Route: settings.Route{Name: smsInbox, Topic: "notifications.sms", What: "SMS event", Calls: true,
		Concurrency: 128, MaxConcurrency: 10000,
		ConcurrencyHelp: "most SMS being sent at once, across partitions"},
		inspect: inspect.SMS,
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			sender, err := smsSender(cfg, deps.logger, deps.tracer)
			if err != nil {
				return inboxworker.Route{}, err
			}
			lease := cfg.SMSCallLease()
			h, err := notify.NewHandler(notify.Config{Sender: sender, Validity: cfg.SMSValidity,
				RecipientLimits: cfg.SMSRecipientLimits, Hold: 2 * lease, Pool: deps.pool, Logger: deps.logger})
			return inboxworker.Route{Call: h, CallLease: lease}, err
		}},
	// The order events the payment route emits, also where the outbox relay publishes them
	// (TOPIC_PAYMENT_EVENTS; "-": no events are emitted): an order paid asks for the customer's
	// payment-received SMS, through the outbox, to the SMS route.
	{Route: settings.Route{Name: paymentEventsInbox, Topic: "payments.events", What: "order event", Optional: true,
		Concurrency: 4, MaxConcurrency: 1000,
		ConcurrencyHelp: "most order-event transactions (batches) at once, across partitions"},
		handler: func(cfg *Config, deps routeDeps) (inboxworker.Route, error) {
			h, err := receipt.NewHandler(receipt.Config{SMSTopic: cfg.Topic(smsInbox), Logger: deps.logger})
			return inboxworker.Route{Handler: h}, err
		}},
}

// paymentVerifier verifies the payment callbacks as PAYMENT_SIGNATURE says; nil, said once at start,
// when they are not verified.
func paymentVerifier(cfg *Config, logger *slog.Logger) (inboxworker.Verifier, error) {
	if cfg.PaymentSignature != "standard-webhooks" {
		logger.Info("payment callbacks are not verified (PAYMENT_SIGNATURE off): whoever can produce to the topic can pay an order",
			"topic", cfg.Topic(paymentsInbox))
		return nil, nil
	}
	v, err := signature.NewVerifier(cfg.PaymentSigningKeys, cfg.PaymentSignatureTolerance)
	if err != nil {
		return nil, err
	}
	logger.Info("payment callbacks are verified (Standard Webhooks)", "topic", cfg.Topic(paymentsInbox),
		"keys", strings.Join(cfg.PaymentSigningKeys.Names(), ","), "tolerance", cfg.PaymentSignatureTolerance.String())
	return v, nil
}

// The inbox names of the bundled routes, which the demo's summary reads.
const (
	paymentsInbox      = "payments"
	smsInbox           = "sms"
	paymentEventsInbox = "payment_events"
)

// devTopics are the topics worker dev and worker demo create: those consumed, those emitted to, and
// those of DEV_TOPICS.
func (c *Config) devTopics() []string {
	out := c.Topics()
	for _, t := range append(c.emittedTopics(), c.DevTopics...) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// emittedTopics are the topics the routes emit events to through the outbox: the order events', and
// the SMS topic for the payment-received SMS; none while emission is off.
func (c *Config) emittedTopics() []string {
	if c.Topic(paymentEventsInbox) == "" {
		return nil
	}
	return []string{c.Topic(paymentEventsInbox), c.Topic(smsInbox)}
}

// relayedTopics are the topics the worker's relay publishes to: the emitted topics, none when
// OUTBOX_RELAY is false (another relay, Debezium, publishes the outbox).
func (c *Config) relayedTopics() []string {
	if !c.OutboxRelay {
		return nil
	}
	return c.emittedTopics()
}

// active are the rows of the routes the worker consumes (settings.Config.Consumes).
func (c *Config) active() []routeRow {
	var out []routeRow
	for _, r := range c.routes {
		if c.Consumes(r.Route) {
			out = append(out, r)
		}
	}
	return out
}

// settingsOf is the settings of the binary with routes (settings.All).
func settingsOf(routes []routeRow) []*settings.Var { return settings.All(routeSettings(routes)) }

// routeSettings are the routes' settings.Route.
func routeSettings(routes []routeRow) []settings.Route {
	out := make([]settings.Route, len(routes))
	for i, r := range routes {
		out[i] = r.Route
	}
	return out
}

// resolve resolves the settings of fs, all of the binary with routes (settings.Resolve), with the
// checks of what they name: the status endpoint's URL, the SMS provider's.
func resolve(fs *envflag.Set[settings.Config], getenv func(string) string, routes []routeRow, all []*settings.Var) (*Config, error) {
	c, err := settings.Resolve(fs, getenv, routeSettings(routes), all, func(c *settings.Config, fail settings.Fail) error {
		if _, err := paymentStatus(c); err != nil {
			return fail("PAYMENT_STATUS_URL", "%v", err)
		}
		// The provider's URL and token are checked by the sender itself, here rather than once the
		// connections are made.
		if _, se := providerSender(c, nil); se != nil {
			return fail(se.Name, "%v", se.Err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Config{Config: c, routes: routes}, nil
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
		s := c.Route(r.Name)
		route.Topic, route.Name, route.Retention, route.Concurrency = s.Topic, r.Name, s.Retention, s.Concurrency
		route.RateLimit = float64(s.RateLimit)
		out = append(out, route)
	}
	return out, nil
}
