package consumer_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/poll"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// The crash tests run a worker in a child process, which is this test binary run again with
// childEnv set: TestMain then runs a consumer instead of the tests, and the child kills itself with
// SIGKILL at the point the test chose. The broker and the database outlive it.

const (
	childEnv      = "CONSUMER_TEST_CHILD" // the child's mode
	childBroker   = "CONSUMER_TEST_BROKER"
	childDatabase = "CONSUMER_TEST_DATABASE_URL"
	childKey      = "CONSUMER_TEST_KEY"
	childBatch    = "CONSUMER_TEST_PER_BATCH"    // set: Transactions PerBatch
	childOrdering = "CONSUMER_TEST_BY_PARTITION" // set: Ordering ByPartition
	childParked   = "CONSUMER_TEST_PARKED"       // an idempotency key whose order does not exist: parked
)

// The child's modes: where it kills itself.
const (
	// dieBeforeOffsetCommit: after the first batch's transactions committed, before its offset
	// commit.
	dieBeforeOffsetCommit = "die-before-offset-commit"
	// dieInHandler: in the handler of the message with key childKey, after writing its effect,
	// before the transaction commits; every time.
	dieInHandler = "die-in-handler"
)

// runChild runs a consumer until SIGTERM, then exits 0; or dies as its mode says.
func runChild() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("process", "child")
	ctx, stop := signalContext()
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv(childDatabase))
	if err != nil {
		log.Error("child: connect", "error", err)
		os.Exit(2)
	}
	store, err := inbox.NewStore(pool, inbox.Config{Logger: log})
	if err != nil {
		log.Error("child: store", "error", err)
		os.Exit(2)
	}
	h := &recorder{}
	switch os.Getenv(childEnv) {
	case dieInHandler:
		key := os.Getenv(childKey)
		h.after = func(d inbox.Delivery) {
			if d.Key == key {
				die(log, "in the handler of "+key)
			}
		}
	}
	mode := testMode{tx: consumer.PerMessage, order: consumer.ByKey}
	if os.Getenv(childBatch) != "" {
		mode.tx = consumer.PerBatch
	}
	if os.Getenv(childOrdering) != "" {
		mode.order = consumer.ByPartition
	}
	config := testConfig(os.Getenv(childBroker), pool, store, h, mode, log)
	// Short, so that the partitions of the child, killed, move on quickly to the test's consumer.
	config.SessionTimeout = 1500 * time.Millisecond
	if key := os.Getenv(childParked); key != "" {
		h.fail = failUntil(key, nil)
		parkSoon(&config)
	}
	c, err := consumer.New(config)
	if err == nil {
		if os.Getenv(childEnv) == dieBeforeOffsetCommit {
			consumer.SetBeforeOffsetCommit(c, func(string, int, int64) { die(log, "before the offset commit") })
		}
		err = c.Run(ctx)
	}
	if err != nil {
		log.Error("child: run", "error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func die(log *slog.Logger, where string) {
	log.Info("child: killing itself " + where)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM)
}

// child is a worker process under test.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // from Wait
}

// startChild starts a worker process in mode, consuming from e's broker into e's schema, in e's
// mode of transactions.
func (e *env) startChild(mode, key string, env ...string) *child {
	e.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"="+mode,
		childBroker+"="+e.kafka.Addr,
		childDatabase+"="+e.db.URL,
		childKey+"="+key,
		// A race-built child otherwise sleeps a second at exit, for reports that never come.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"),
	)
	if e.mode.tx == consumer.PerBatch {
		cmd.Env = append(cmd.Env, childBatch+"=1")
	}
	if e.mode.order == consumer.ByPartition {
		cmd.Env = append(cmd.Env, childOrdering+"=1")
	}
	cmd.Env = append(cmd.Env, env...)
	w := testlog.Writer(e.t)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// killed waits for the child to exit and reports whether SIGKILL ended it.
func (c *child) killed(t testing.TB) bool {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(poll.Timeout):
		t.Fatal("the child process did not exit")
	}
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// stop stops the child as an orchestrator would, with SIGTERM, and checks that it exits 0.
func (c *child) stop(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(poll.Timeout):
		t.Fatal("the child process did not stop")
	}
	if c.err != nil {
		t.Errorf("the child process ended with %v, want exit code 0", c.err)
	}
}
