package consumer_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestCrash kills a worker process with SIGKILL and checks that a new worker applies each message
// exactly once.
func TestCrash(t *testing.T) {
	t.Parallel()

	t.Run("AfterDatabaseCommit", func(t *testing.T) {
		t.Parallel()
		forEachMode(t, testCrashAfterDatabaseCommit)
	})
	t.Run("InTransaction", func(t *testing.T) {
		t.Parallel()
		forEachMode(t, testCrashInTransaction)
	})
}

func testCrashAfterDatabaseCommit(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	all := keys("crash", 5)
	e.produce(all...)

	// The first batch's transactions commit; the process dies before its offset commit.
	if !e.startChild(dieBeforeOffsetCommit, "").killed(t) {
		t.Fatal("the worker was not killed")
	}
	appliedBefore := len(e.effects())
	if appliedBefore == 0 {
		t.Fatal("the killed worker applied nothing: the test kills it too early")
	}
	if got := e.committed(); got != 0 {
		t.Fatalf("committed %d offsets before the kill, want none", got)
	}

	config := e.config(&recorder{})
	e.start(config)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	checkOnce(t, e, all)
	// By key, the killed worker's transactions run concurrently: one whose commit reached Postgres
	// as the worker died may show only after the count above. Each message is applied once either
	// way (checkOnce); the new worker found at least those seen applied, and applied the rest.
	dup, applied := outcomes(config, "duplicate"), outcomes(config, "applied")
	if dup < float64(appliedBefore) || dup+applied != float64(len(all)) {
		t.Errorf("duplicates %v, applied %v: want at least the %d messages the killed worker applied as duplicates, and %d in all",
			dup, applied, appliedBefore, len(all))
	}
}

func testCrashInTransaction(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	all := keys("crash", 5)
	e.produce(all...)

	// The worker dies in the handler of the third message, its effect written, uncommitted.
	if !e.startChild(dieInHandler, all[2]).killed(t) {
		t.Fatal("the worker was not killed")
	}
	if got := e.effects(); got[all[2]] != 0 || e.inboxKeys()[all[2]] != 0 {
		t.Fatalf("the transaction the worker died in left an effect or an inbox row: %v", got)
	}

	e.start(e.config(&recorder{}))
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	checkOnce(t, e, all)
}

// TestCrashLoop runs workers that die in the handler of one message every time: after as many
// starts of it as docs/design.md promises, it is dead-lettered without running, and its partition
// moves on.
func TestCrashLoop(t *testing.T) {
	t.Parallel()
	forEachMode(t, testCrashLoop)
}

func testCrashLoop(t *testing.T, mode testMode) {
	starts := promisedCrashLoopStarts(t)
	e := setup(t, mode, 1)
	all := []string{"before", "poison", "after-1", "after-2"}
	e.produce(all...)

	kills := 0
	for {
		w := e.startChild(dieInHandler, "poison")
		// Past the poison is every offset committed: by key, the messages after it may be applied
		// before it kills the worker.
		e.waitFor("the worker to die or get past the poison", func() bool {
			return w.exited() || e.committed() == int64(len(all))
		})
		if !w.exited() {
			w.stop(t)
			break
		}
		if !w.killed(t) {
			t.Fatalf("the worker exited by itself: %v", w.err)
		}
		kills++
		if kills > starts+1 {
			t.Fatalf("the worker died %d times: the crash loop was not broken", kills)
		}
	}
	// The first death may come in a batch of several messages, which is narrowed to single messages
	// afterwards: the poison's own starts are counted from its first single start.
	if kills < starts {
		t.Errorf("dead-lettered after %d deaths, want at least %d", kills, starts)
	}

	dead := e.deadLetters()
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	if got := kafkatest.Header(dead[0], deadletter.HeaderReason); got != string(inboxtype.CrashLoop) {
		t.Errorf("dlq-reason = %q, want %q", got, inboxtype.CrashLoop)
	}
	if got := kafkatest.Header(dead[0], deadletter.HeaderOriginalOffset); got != "1" {
		t.Errorf("dlq-original-offset = %q, want 1", got)
	}
	if got := kafkatest.Header(dead[0], deadletter.HeaderAttempts); got != strconv.Itoa(starts) {
		t.Errorf("dlq-attempts = %q, want %d", got, starts)
	}
	if got := e.committed(); got != int64(len(all)) {
		t.Errorf("committed %d offsets, want %d", got, len(all))
	}
	checkOnce(t, e, []string{"before", "after-1", "after-2"})
}

// promisedCrashLoopStarts reads from docs/design.md how many starts without finishing make a message a
// crash loop: the tests check the number operators were told, not the code's own constant.
func promisedCrashLoopStarts(t *testing.T) int {
	t.Helper()
	design, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`dead-letters a message started\s+(\d+)\s+times without finishing`).FindSubmatch(design)
	if m == nil {
		t.Fatal("docs/design.md does not say after how many starts a message is a crash loop")
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkOnce checks that each key was applied exactly once, and nothing else.
func checkOnce(t *testing.T, e *env, keys []string) {
	t.Helper()
	effects := e.effects()
	for _, k := range keys {
		if effects[k] != 1 {
			t.Errorf("%s applied %d times, want once", k, effects[k])
		}
	}
	if len(effects) != len(keys) {
		t.Errorf("effects = %v, want exactly %v once", effects, keys)
	}
}

// newBrokerRun is the run-th run of TestCrashLoopOffsetsRestart: a new one-partition broker over db,
// its topic holding one message, at offset 0, whose key it returns.
func newBrokerRun(t *testing.T, mode testMode, db *pgtest.DB, run int) (*env, string) {
	e := &env{t: t, mode: mode, kafka: kafkatest.Start(t, 1, topic, dlqTopic), db: db, partitions: 1, log: testlog.New(t)}
	key := "run-" + strconv.Itoa(run)
	e.produce(key)
	return e, key
}

// TestCrashLoopOffsetsRestart runs workers one after another on one database, each against a new
// broker whose topic holds one new message at offset 0, as `worker dev` restarted does: no worker
// dies in a message, so none may be dead-lettered as a crash loop, however often offset 0 was
// started before.
func TestCrashLoopOffsetsRestart(t *testing.T) {
	t.Parallel()
	runs := promisedCrashLoopStarts(t) + 2

	// Each worker finishes its message and stops cleanly.
	t.Run("Stopped", func(t *testing.T) {
		t.Parallel()
		forEachMode(t, func(t *testing.T, mode testMode) {
			db := pgtest.Schema(t)
			if _, err := db.Pool.Exec(t.Context(), effectsTable); err != nil {
				t.Fatal(err)
			}
			var all []string
			for run := range runs {
				e, key := newBrokerRun(t, mode, db, run)
				all = append(all, key)
				config := e.config(&recorder{})
				_, stop := e.start(config)
				e.waitFor("the offset committed", func() bool { return e.committed() == 1 })
				stop()
				if dead := e.deadLetters(); len(dead) != 0 {
					t.Fatalf("run %d dead-lettered its message: %s", run, kafkatest.Header(dead[0], "dlq-reason"))
				}
				checkOnce(t, e, all)
			}
		})
	})

	// Each worker is killed after its message's transaction committed, before its offset commit:
	// it leaves its range recorded, about a message no later broker has.
	t.Run("Killed", func(t *testing.T) {
		t.Parallel()
		mode := testMode{tx: consumer.PerBatch, order: consumer.ByKey}
		db := pgtest.Schema(t)
		if _, err := db.Pool.Exec(t.Context(), effectsTable); err != nil {
			t.Fatal(err)
		}
		var all []string
		for run := range runs {
			e, key := newBrokerRun(t, mode, db, run)
			all = append(all, key)
			if !e.startChild(dieBeforeOffsetCommit, "").killed(t) {
				t.Fatalf("run %d: the worker was not killed", run)
			}
			if dead := e.deadLetters(); len(dead) != 0 {
				t.Fatalf("run %d dead-lettered its message: %s", run, kafkatest.Header(dead[0], "dlq-reason"))
			}
			checkOnce(t, e, all)
		}
	})
}

// TestCrashLoopInPlace: a message whose range a previous run started as often as a crash loop takes
// is dead-lettered crash_loop on its next start, without running, and counted as finished with its
// handle time (the consumer's stop checks that every finished message has one).
func TestCrashLoopInPlace(t *testing.T) {
	t.Parallel()
	forEachMode(t, func(t *testing.T, mode testMode) {
		e := setup(t, mode, 1)
		msgs := e.produce("poison", "after")
		config := e.config(&recorder{})
		where := inbox.Partition{Group: group, Topic: topic, Partition: 0}
		died := inbox.StartedRange{First: 0, Last: 0, FirstFingerprint: inbox.Fingerprint(msgs[0].Value)}
		for range promisedCrashLoopStarts(t) {
			if _, err := config.Store.StartLog().Record(t.Context(), where, died, 0); err != nil {
				t.Fatal(err)
			}
		}
		_, stop := e.start(config)
		e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })
		stop()
		dead := e.deadLetters()
		if len(dead) != 1 || kafkatest.Header(dead[0], deadletter.HeaderReason) != string(inboxtype.CrashLoop) {
			t.Fatalf("%d dead letters, want poison's, crash_loop", len(dead))
		}
		if n := outcomes(config, "dead_lettered"); n != 1 {
			t.Errorf("%v messages counted dead_lettered, want 1", n)
		}
		checkOnce(t, e, []string{"after"})
	})
}
