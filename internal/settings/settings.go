// Package settings is the worker's configuration as the contract names it: every variable, with
// its flag, default, bound, help, and how the startup line shows it, in one table (vars) and a
// route's (Route); resolved from the environment and the flags (Resolve, each flag winning over its
// variable) into a Config, and checked against one another before anything starts. It builds
// nothing: the commands (package cli) build the worker from a Config.
package settings

import (
	"fmt"
	neturl "net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// A Var is one setting, one configuration variable: in the table vars, or a route's (Route).
type Var = envflag.Var[Config]

// An Error names the setting it is about: it is printed as one line.
type Error = envflag.Error

// Fail is the error about the setting env that format and args describe, naming the setting as it
// was given: its variable, or its flag.
type Fail func(env, format string, args ...any) error

// The commands, as the bits of Var.Use: a setting names the commands that read it.
const (
	UseRun uint64 = 1 << iota
	UseMigrate
	UseDev
	UseDemo
	UseReplay
	UseParked
	UseInspect

	// UseWorker are the commands that run the consumer: its tuning applies to them.
	UseWorker = UseRun | UseDev
	// UseBrokers are the commands that reach the brokers of KAFKA_BROKERS, not an embedded one.
	UseBrokers = UseRun | UseReplay | UseParked
	// UseDatabase are the commands that reach DATABASE_URL: all of them.
	UseDatabase = UseRun | UseMigrate | UseDev | UseDemo | UseReplay | UseParked | UseInspect
	// UseTopics are the commands that know the consumed topics.
	UseTopics = UseWorker | UseDemo
	// UseTracing are the commands that trace their work when OpenTelemetry's OTEL_* variables say
	// so (package tracing): those that run the consumer.
	UseTracing = UseWorker | UseDemo
)

// How the startup line shows a secret's and a URL's value.
var (
	secret = redact.Secret
	url    = redact.URL
)

// lookup returns the setting of env, one of c's settings.
func (c *Config) lookup(env string) *Var {
	for _, s := range c.all {
		if s.Env == env {
			return s
		}
	}
	panic("settings: no setting " + env)
}

// Resolve resolves the settings of fs (see envflag.Set.Resolve), all of the binary with routes,
// then checks them against one another, and as extra does.
func Resolve(fs *envflag.Set[Config], getenv func(string) string, routes []Route, all []*Var,
	extra func(*Config, Fail) error) (*Config, error) {
	c := &Config{routes: routes, all: all}
	for _, r := range routes {
		c.Route(r.Name)
	}
	r, err := fs.Resolve(c, all, getenv)
	if err != nil {
		return nil, err
	}
	c.resolved = r
	fail := func(env, format string, args ...any) error {
		return &Error{Name: c.lookup(env).Name(r.FromFlag(env)), Err: fmt.Errorf(format, args...)}
	}
	if err := c.check(fail, extra); err != nil {
		return nil, err
	}
	return c, nil
}

// Explicit reports whether the setting env was given by flag or environment, not defaulted.
func (c *Config) Explicit(env string) bool { return c.resolved.Explicit[env] }

// Override sets a setting to a value decided at run time (the address a broker bound, say), as
// if it had been given, so that the startup line shows it.
func (c *Config) Override(env, raw string) error {
	return envflag.Override(c, c.resolved, c.lookup(env), raw)
}

// parseTopic accepts a Kafka topic name (or a DLQ suffix, which follows the same rules).
func parseTopic(dst *string, v string) error {
	if err := startup.CheckTopicName(v); err != nil {
		return err
	}
	*dst = v
	return nil
}

// maxDevTopics bounds DEV_TOPICS.
const maxDevTopics = 100

// parseTopicList accepts a comma-separated list of Kafka topic names, at most maxDevTopics; ""
// is none.
func parseTopicList(dst *[]string, v string) error {
	var out []string
	for t := range strings.SplitSeq(v, ",") {
		if t = strings.TrimSpace(t); t == "" {
			continue
		}
		if err := startup.CheckTopicName(t); err != nil {
			return err
		}
		out = append(out, t)
	}
	if len(out) > maxDevTopics {
		return fmt.Errorf("%d topics, more than %d", len(out), maxDevTopics)
	}
	*dst = out
	return nil
}

func parseDatabaseURL(dst *string, v string) error {
	u, err := neturl.Parse(v)
	if err != nil {
		return fmt.Errorf("invalid URL %q", redact.URL(v))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("invalid URL %q (want postgres://user:password@host:port/database)", redact.URL(v))
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		return fmt.Errorf("invalid URL %q: no host", redact.URL(v))
	}
	if _, err := pgxpool.ParseConfig(v); err != nil {
		return fmt.Errorf("invalid URL %q: %s", redact.URL(v), redact.PgxConfigError(err, v))
	}
	*dst = v
	return nil
}
