package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/redact"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// A setting is one configuration variable: its environment variable, its flag, its default, its
// help, how its value is shown, which commands read it and how it is parsed into a Config.
type setting struct {
	// env is the environment variable; "" for a flag-only setting.
	env   string
	flag  string
	def   string
	usage string
	// meta names the value in --help (LIST, DURATION...); empty for a boolean.
	meta string
	// kind says how the startup line shows the value.
	kind kind
	// canonical, when set, is the form of the value the startup line shows.
	canonical func(string) string
	// use are the commands that read the setting; a command's own flags leave it zero.
	use use
	set func(c *Config, v string) error
}

func (s *setting) boolean() bool { return s.meta == "" }

// shown is raw as the startup line shows it.
func (s *setting) shown(raw string) string {
	if s.canonical != nil {
		raw = s.canonical(raw)
	}
	switch s.kind {
	case secret:
		return redact.Secret(raw)
	case url:
		return redact.URL(raw)
	}
	return raw
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
	if fromFlag || s.env == "" {
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
// default; then checks the settings against one another. Settings a command does not use keep
// their defaults, so that every field is meaningful.
func (cf *configFlags) config(getenv func(string) string) (*Config, error) {
	c := &Config{explicit: map[string]bool{}, shown: map[string]string{}}
	bound := map[*setting]*flagValue{}
	all := settings
	for _, v := range cf.values {
		bound[v.s] = v
		if v.s.use == 0 { // a command's own flag
			all = append(all[:len(all):len(all)], v.s)
		}
	}
	for _, s := range all {
		raw, fromFlag, given := s.def, false, false
		if v := bound[s]; v != nil {
			switch e := getenv(s.env); {
			case v.isSet:
				raw, fromFlag, given = v.value, true, true
			case s.env != "" && e != "":
				raw, given = e, true
			}
		}
		if given && s.env != "" {
			c.explicit[s.env] = true
		}
		if err := s.set(c, raw); err != nil {
			return nil, &settingError{name: s.name(fromFlag), err: err}
		}
		if s.env != "" {
			c.shown[s.env] = s.shown(raw)
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

// override sets a setting to a value decided at run time (the address a broker bound, say), as
// if it had been given, so that the startup line shows it.
func (c *Config) override(env, raw string) error {
	s := lookupSetting(env)
	if err := s.set(c, raw); err != nil {
		return &settingError{name: env, err: err}
	}
	c.shown[env] = s.shown(raw)
	return nil
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
