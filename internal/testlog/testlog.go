// Package testlog routes a component's slog output to the test's log, where it shows only when the
// test fails or runs with -v. It is for tests only.
package testlog

import (
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
