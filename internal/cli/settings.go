package cli

import (
	"fmt"
	neturl "net/url"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/envflag"
	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// A setting is one configuration variable, in the table settings.
type setting = envflag.Var[Config]

// A settingError names the setting it is about: it is printed as one line.
type settingError = envflag.Error

// The commands, as the bits of setting.Use: a setting names the commands that read it.
const (
	useRun uint64 = 1 << iota
	useMigrate
	useDev
	useDemo
	useReplay
	useParked
	useInspect

	// useWorker are the commands that run the consumer: its tuning applies to them.
	useWorker = useRun | useDev
	// useBrokers are the commands that reach the brokers of KAFKA_BROKERS, not an embedded one.
	useBrokers = useRun | useReplay | useParked
	// useDatabase are the commands that reach DATABASE_URL: all of them.
	useDatabase = useRun | useMigrate | useDev | useDemo | useReplay | useParked | useInspect
	// useTopics are the commands that know the consumed topics.
	useTopics = useWorker | useDemo
	// useTracing are the commands that trace their work when OpenTelemetry's OTEL_* variables say
	// so (package tracing): those that run the consumer.
	useTracing = useWorker | useDemo
)

// How the startup line shows a secret's and a URL's value.
var (
	secret = redact.Secret
	url    = redact.URL
)

// lookupSetting returns the setting of env, one of c's settings.
func (c *Config) lookupSetting(env string) *setting {
	for _, s := range c.settings {
		if s.Env == env {
			return s
		}
	}
	panic("cli: no setting " + env)
}

// resolve resolves the settings of fs (see envflag.Set.Resolve), all of the binary with routes,
// then checks them against one another.
func resolve(fs *envflag.Set[Config], getenv func(string) string, routes []routeRow, all []*setting) (*Config, error) {
	c := &Config{routes: routes, settings: all}
	for _, r := range routes {
		c.route(r.name)
	}
	r, err := fs.Resolve(c, all, getenv)
	if err != nil {
		return nil, err
	}
	c.resolved = r
	if err := c.check(func(env string) string { return c.lookupSetting(env).Name(r.FromFlag(env)) }); err != nil {
		return nil, err
	}
	return c, nil
}

// explicit reports whether the setting env was given by flag or environment, not defaulted.
func (c *Config) explicit(env string) bool { return c.resolved.Explicit[env] }

// override sets a setting to a value decided at run time (the address a broker bound, say), as
// if it had been given, so that the startup line shows it.
func (c *Config) override(env, raw string) error {
	return envflag.Override(c, c.resolved, c.lookupSetting(env), raw)
}

// parseTopic accepts a Kafka topic name (or a DLQ suffix, which follows the same rules).
func parseTopic(dst *string, v string) error {
	if err := startup.CheckTopicName(v); err != nil {
		return err
	}
	*dst = v
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
