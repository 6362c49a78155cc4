// Package testlog routes a component's slog output to the test's log, where it shows only when the
// test fails or runs with -v. It is for tests only.
package testlog

import (
	"context"
	"errors"
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
func New(tb testing.TB) *slog.Logger {
	w := Writer(tb)
	level := slog.LevelInfo
	if os.Getenv("LOG_LEVEL") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
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
