package settings

import (
	"fmt"
	"strings"
	"time"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// Route is one route of the binary as its settings see it: its settings (its topic, how long its
// keys are remembered, how many of its handlers run at once, a call route's rate limit) are derived
// from it (Route.settings), each named after Name.
type Route struct {
	// Name is the route's name in the inbox, and the stem of its settings: TOPIC_<NAME>,
	// INBOX_RETENTION_<NAME>, <NAME>_CONCURRENCY.
	Name string
	// Topic is its topic's default; What what its messages are, for the settings' help.
	Topic, What string
	// Concurrency is the default of <NAME>_CONCURRENCY, ConcurrencyHelp its help, and
	// MaxConcurrency its bound.
	Concurrency     int
	ConcurrencyHelp string
	MaxConcurrency  int
	// Calls: its handler is a call handler, whose calls <NAME>_RATE_LIMIT bounds.
	Calls bool
	// Optional: its topic may be "-", which turns the route off; and it is consumed only when its
	// topic is set, or by worker dev and worker demo, which create it (Config.Receipts): a consumer
	// group one of whose topics does not exist consumes none of them, so a default must not name a
	// topic that may not exist yet.
	Optional bool
}

// RouteSettings are a route's settings, as its Route derives them.
type RouteSettings struct {
	Topic string
	// Retention is how long its idempotency keys are remembered. Zero (the default) means "as long
	// as the topic can redeliver": settled at start, from the topic's configuration, by the
	// commands that run the worker.
	Retention   time.Duration
	Concurrency int
	// RateLimit is the most calls per second of a call route, for the whole group; 0: none.
	RateLimit int
}

// Route returns the settings of the route named name, made when first asked for.
func (c *Config) Route(name string) *RouteSettings {
	if c.Routes == nil {
		c.Routes = map[string]*RouteSettings{}
	}
	if c.Routes[name] == nil {
		c.Routes[name] = &RouteSettings{}
	}
	return c.Routes[name]
}

// Topic returns the topic of the route named name.
func (c *Config) Topic(name string) string { return c.Route(name).Topic }

// All is the settings of the binary with routes: those of the table settings, each route's
// after DATABASE_URL, in the order of routes.
func All(routes []Route) []*Var {
	var out []*Var
	for _, s := range vars {
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
func (r Route) settings() []*Var {
	stem := strings.ToUpper(r.Name)
	flag := strings.ReplaceAll(r.Name, "_", "-")
	out := []*Var{
		{Env: "TOPIC_" + stem, Flag: "topic-" + flag, Default: r.Topic, Meta: "TOPIC", Use: UseTopics | UseInspect,
			Usage: r.topicHelp(),
			Set: func(c *Config, v string) error {
				if r.Optional && (v == "-" || v == "") {
					c.Route(r.Name).Topic = ""
					return nil
				}
				return parseTopic(&c.Route(r.Name).Topic, v)
			}},
		{Env: "INBOX_RETENTION_" + stem, Flag: "inbox-retention-" + flag, Meta: "DURATION", Use: UseWorker,
			Shown: settledFromTopic,
			Usage: "how long a " + r.What + "'s idempotency key is remembered " +
				"(unset: the topic's retention.ms + segment.ms + 1h, read at start)",
			Bound: retentionBound,
			Set: func(c *Config, v string) error {
				return envflag.OptionalDuration(&c.Route(r.Name).Retention, v)
			}},
		{Env: stem + "_CONCURRENCY", Flag: flag + "-concurrency", Default: fmt.Sprint(r.Concurrency), Meta: "N",
			Use: UseWorker, Usage: r.ConcurrencyHelp, Bound: envflag.Counts(1, r.MaxConcurrency),
			Set: func(c *Config, v string) error { return envflag.Positive(&c.Route(r.Name).Concurrency, v) }},
	}
	if r.Calls {
		out = append(out, &Var{Env: stem + "_RATE_LIMIT", Flag: flag + "-rate-limit", Meta: "N", Use: UseWorker,
			Usage: "most calls per second of the " + r.Name + " route for the whole consumer group, each instance " +
				"taking the share of the partitions it owns (unset: none)",
			Bound: envflag.Counts(1, 100000),
			Set:   func(c *Config, v string) error { return envflag.Limit(&c.Route(r.Name).RateLimit, v) }})
	}
	return out
}

// topicHelp is the help of r's topic setting.
func (r Route) topicHelp() string {
	if r.Optional {
		return r.What + " topic (- turns the route off; consumed when set, and by worker dev and demo)"
	}
	return r.What + " topic"
}

// Consumes reports whether the worker consumes route r: every route does, but an optional one that
// is off, or whose topic was not set outside worker dev and worker demo.
func (c *Config) Consumes(r Route) bool {
	return !r.Optional || c.Topic(r.Name) != "" && (c.Receipts || c.Explicit("TOPIC_"+strings.ToUpper(r.Name)))
}

// checkTopics checks the routes' topics and their dead-letter topics against one another: no two
// routes on one topic, and no route consuming another's dead letters.
func (c *Config) checkTopics(fail Fail) error {
	for i, r := range c.routes {
		t, env := c.Topic(r.Name), "TOPIC_"+strings.ToUpper(r.Name)
		if t == "" {
			continue // an optional route, off
		}
		if n := len(t + c.DLQSuffix); n > startup.MaxTopicName {
			return fail("DLQ_SUFFIX", "%s + DLQ_SUFFIX is %d characters, more than a topic name's %d",
				env, n, startup.MaxTopicName)
		}
		for _, o := range c.routes[:i] {
			other, otherEnv := c.Topic(o.Name), "TOPIC_"+strings.ToUpper(o.Name)
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

// Topics are the topics of the routes the worker consumes.
func (c *Config) Topics() []string {
	var out []string
	for _, r := range c.routes {
		if c.Consumes(r) {
			out = append(out, c.Topic(r.Name))
		}
	}
	return out
}
