// Package envflag reads a program's settings from environment variables and the flags that match
// them (KAFKA_BROKERS ↔ --kafka-brokers): a flag wins over its variable, a variable over the
// default. Every value is parsed once all sources are known, so that a bad value is reported the
// same way wherever it came from, as one line naming the flag when it came from one and the
// variable otherwise. Flags may come before, between or after positional arguments. It prints the
// help of a set of settings, and records each value as given, for a startup line.
//
// It holds no setting of its own: the program declares them in one table of Vars, each with its
// parser (the parsers here are common ones) and, for a number, its Bound (Durations, Counts): the
// range outside of which a value is refused, shown in the help. It does not decide which command reads which setting.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// A Var is one setting of a configuration C: everything there is to it.
type Var[C any] struct {
	// Env is the environment variable; "" for a flag-only setting.
	Env     string
	Flag    string
	Default string
	Usage   string
	// Meta names the value in the help (LIST, DURATION...); "" for a boolean flag.
	Meta string
	// Shown, when set, is the value as Resolve records it for display (masked, say); else as given.
	Shown func(raw string) string
	// Use is the set of commands that read it, as bits the program defines; 0 for a command's own.
	Use uint64
	// Set parses raw into c. Its error does not name the setting: Resolve does.
	Set func(c *C, raw string) error
	// Bound, when set, is the range of values the setting accepts, checked once Set has accepted
	// the value's form and shown by PrintHelp (see Durations and Counts).
	Bound Bound
}

// Boolean reports whether the flag takes no value.
func (v *Var[C]) Boolean() bool { return v.Meta == "" }

// Name is how errors name the setting: its flag when the value came from the command line, else
// its environment variable.
func (v *Var[C]) Name(fromFlag bool) string {
	if fromFlag || v.Env == "" {
		return "--" + v.Flag
	}
	return v.Env
}

// An Error is a configuration error that names its setting, printed as one line.
type Error struct {
	Name string
	Err  error
}

func (e *Error) Error() string { return e.Name + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// value records a flag's raw text.
type value[C any] struct {
	v     *Var[C]
	text  string
	isSet bool
}

func (v *value[C]) String() string     { return v.text }
func (v *value[C]) Set(s string) error { v.text, v.isSet = s, true; return nil }
func (v *value[C]) IsBoolFlag() bool   { return v.v.Boolean() }

// A Set is the flags of one command, bound to its Vars.
type Set[C any] struct {
	fs    *flag.FlagSet
	bound map[*Var[C]]*value[C]
}

// NewSet returns the flags of vars, for the command name.
func NewSet[C any](name string, vars []*Var[C]) *Set[C] {
	s := &Set[C]{fs: flag.NewFlagSet(name, flag.ContinueOnError), bound: map[*Var[C]]*value[C]{}}
	s.fs.SetOutput(io.Discard)
	s.fs.Usage = func() {}
	for _, v := range vars {
		val := &value[C]{v: v}
		s.bound[v] = val
		s.fs.Var(val, v.Flag, v.Usage)
	}
	return s
}

// Parse parses args, which may mix flags and positional arguments, and returns the positional ones.
// It returns flag.ErrHelp for -h/--help.
func (s *Set[C]) Parse(args []string) ([]string, error) {
	var positional []string
	for {
		if err := s.fs.Parse(args); err != nil {
			return nil, flagError(err)
		}
		if s.fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, s.fs.Arg(0))
		args = s.fs.Args()[1:]
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

// Resolved is what Resolve found, by environment variable.
type Resolved struct {
	// Explicit holds the settings given by flag or environment, not defaulted.
	Explicit map[string]bool
	// Shown holds each value as given, through its Var's Shown.
	Shown map[string]string
	// fromFlag holds the settings given by flag.
	fromFlag map[string]bool
}

// Resolve sets c from every one of all: for those bound to the set, the flag when given, else the
// environment (read through getenv), else the default; for the others, the default, so that every
// field of c is meaningful. The set's own flags that all lacks are resolved after it.
func (s *Set[C]) Resolve(c *C, all []*Var[C], getenv func(string) string) (*Resolved, error) {
	r := &Resolved{Explicit: map[string]bool{}, Shown: map[string]string{}, fromFlag: map[string]bool{}}
	listed := map[*Var[C]]bool{}
	for _, v := range all {
		listed[v] = true
	}
	for v := range s.bound {
		if !listed[v] {
			all = append(all[:len(all):len(all)], v)
		}
	}
	for _, v := range all {
		raw, fromFlag, given := v.Default, false, false
		if b := s.bound[v]; b != nil {
			switch e := getenv(v.Env); {
			case b.isSet:
				raw, fromFlag, given = b.text, true, true
			case v.Env != "" && e != "":
				raw, given = e, true
			}
		}
		if err := v.set(c, raw); err != nil {
			return nil, &Error{Name: v.Name(fromFlag), Err: err}
		}
		if v.Env == "" {
			continue
		}
		r.Explicit[v.Env], r.fromFlag[v.Env] = given, fromFlag
		r.Shown[v.Env] = v.shown(raw)
	}
	return r, nil
}

// set parses raw into c and checks it against the bound.
func (v *Var[C]) set(c *C, raw string) error {
	if err := v.Set(c, raw); err != nil {
		return err
	}
	if v.Bound != nil {
		return v.Bound.Check(raw)
	}
	return nil
}

// FromFlag reports whether the setting env was given by its flag.
func (r *Resolved) FromFlag(env string) bool { return r.fromFlag[env] }

func (v *Var[C]) shown(raw string) string {
	if v.Shown != nil {
		return v.Shown(raw)
	}
	return raw
}

// Override sets v to raw, decided at run time (the address a broker bound, say), as if it had been
// given, so that r shows it.
func Override[C any](c *C, r *Resolved, v *Var[C], raw string) error {
	if err := v.set(c, raw); err != nil {
		return &Error{Name: v.Env, Err: err}
	}
	r.Shown[v.Env] = v.shown(raw)
	return nil
}

// PrintHelp prints vars, one flag each with its variable and default; defaults overrides the
// description of a default, by variable.
func PrintHelp[C any](w io.Writer, vars []*Var[C], defaults map[string]string) {
	for _, v := range vars {
		head := "  --" + v.Flag
		if !v.Boolean() {
			head += " " + v.Meta
		}
		var notes []string
		if v.Env != "" {
			notes = append(notes, "env "+v.Env)
		}
		if d, ok := defaults[v.Env]; ok {
			notes = append(notes, "default "+d)
		} else if v.Default != "" {
			notes = append(notes, fmt.Sprintf("default %q", v.Default))
		} else {
			notes = append(notes, "default unset")
		}
		if v.Bound != nil {
			notes = append(notes, "from "+v.Bound.String())
		}
		fmt.Fprintf(w, "%s  (%s)\n        %s\n", head, strings.Join(notes, ", "), v.Usage)
	}
}
