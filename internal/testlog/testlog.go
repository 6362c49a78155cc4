// Package testlog routes a component's slog output to the test's log, where it shows only when the
// test fails or runs with -v. Every record is also written as the JSON line the worker would log
// and checked with a strict decoder (Strict): a key twice in one object, which strict log ingesters
// refuse, fails the test. It is for tests only.
package testlog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
)

// New returns a logger that writes to tb.Log until the test ends; later writes, from goroutines
// still winding down, are dropped instead of panicking. Call it before starting anything that logs
// in the background, so that its cleanup, registered first, runs last. The level is info, or
// debug when LOG_LEVEL=debug.
//
// Each record is also formatted as a JSON line and checked with Strict; a line that fails the check
// fails the test.
func New(tb testing.TB) *slog.Logger {
	w := Writer(tb)
	level := slog.LevelInfo
	if os.Getenv("LOG_LEVEL") == "debug" {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	check := &strictWriter{tb: tb}
	tb.Cleanup(check.close)
	return slog.New(&teeHandler{
		text: slog.NewTextHandler(w, opts),
		json: slog.NewJSONHandler(check, opts),
	})
}

// Strict checks that line is one JSON value in which no object has a key twice: what a strict log
// ingester accepts. encoding/json alone keeps the last of two equal keys without a word.
func Strict(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := strictValue(dec, "$"); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value on the line")
	}
	return nil
}

// strictValue reads one value from dec, at path, and its members' values, rejecting a duplicate
// key in any object.
func strictValue(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	switch tok {
	case json.Delim('{'):
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			key, _ := tok.(string)
			if seen[key] {
				return fmt.Errorf("%s: key %q twice in one object", path, key)
			}
			seen[key] = true
			if err := strictValue(dec, path+"."+key); err != nil {
				return err
			}
		}
		_, err = dec.Token() // '}'
	case json.Delim('['):
		for i := 0; dec.More(); i++ {
			if err := strictValue(dec, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err = dec.Token() // ']'
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// teeHandler hands every record to the text handler the test reads and to the JSON handler the
// strict check reads.
type teeHandler struct {
	text, json slog.Handler
}

func (h *teeHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.text.Enabled(ctx, level)
}

func (h *teeHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.json.Handle(ctx, r.Clone())
	return errors.Join(h.text.Handle(ctx, r), err)
}

func (h *teeHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &teeHandler{text: h.text.WithAttrs(attrs), json: h.json.WithAttrs(attrs)}
}

func (h *teeHandler) WithGroup(name string) slog.Handler {
	return &teeHandler{text: h.text.WithGroup(name), json: h.json.WithGroup(name)}
}

// strictWriter checks each JSON line written to it with Strict, failing the test on a bad one,
// until the test ends.
type strictWriter struct {
	mu     sync.Mutex
	tb     testing.TB
	closed bool
}

func (w *strictWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		if err := Strict(p); err != nil {
			w.tb.Errorf("testlog: a log line that strict log ingesters refuse: %v\n%s", err, p)
		}
	}
	return len(p), nil
}

func (w *strictWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// Writer returns a writer of lines to tb.Log, such as a subprocess's output, until the test ends;
// later writes fail. Its cleanup, registered now, runs after those registered later.
func Writer(tb testing.TB) io.Writer {
	w := &writer{tb: tb}
	tb.Cleanup(w.close)
	return w
}

type writer struct {
	mu     sync.Mutex
	tb     testing.TB
	closed bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, errors.New("testlog: the test is over")
	}
	w.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (w *writer) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// Record is one log record as a test inspects it: its level, message and attributes, groups
// flattened into dotted keys.
type Record struct {
	Level   slog.Level
	Message string
	Attrs   map[string]slog.Value
}

// Has reports whether the record has an attribute whose value, as text, is value.
func (r Record) Has(value string) bool {
	for _, v := range r.Attrs {
		if v.String() == value {
			return true
		}
	}
	return false
}

// Records keeps the records of a logger made by Capture.
type Records struct {
	mu      sync.Mutex
	records []Record
}

// All returns the records logged so far.
func (r *Records) All() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.records...)
}

// Capture is New, whose records are also kept for the test to inspect: what a component logs is
// part of what it promises (each retry with its attempt and delay, a warning at start).
func Capture(tb testing.TB) (*slog.Logger, *Records) {
	records := &Records{}
	return slog.New(&captureHandler{next: New(tb).Handler(), records: records}), records
}

type captureHandler struct {
	next    slog.Handler
	records *Records
	attrs   []slog.Attr
	group   string
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := Record{Level: r.Level, Message: r.Message, Attrs: map[string]slog.Value{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		flatten(rec.Attrs, h.group, a)
		return true
	})
	h.records.mu.Lock()
	h.records.records = append(h.records.records, rec)
	h.records.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func flatten(into map[string]slog.Value, prefix string, a slog.Attr) {
	key := a.Key
	if prefix != "" {
		key = prefix + "." + a.Key
	}
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		for _, g := range v.Group() {
			flatten(into, key, g)
		}
		return
	}
	into[key] = v
}

func (h *captureHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(attrs)
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range attrs {
		m := map[string]slog.Value{}
		flatten(m, h.group, a)
		for k, v := range m {
			c.attrs = append(c.attrs, slog.Attr{Key: k, Value: v})
		}
	}
	return &c
}

func (h *captureHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	if c.group != "" {
		name = c.group + "." + name
	}
	c.group = name
	return &c
}
