package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

func TestShutdown(t *testing.T) {
	t.Parallel()

	t.Run("InFlightFinishes", func(t *testing.T) {
		t.Parallel()
		forEachMode(t, testShutdownInFlightFinishes)
	})
	t.Run("TimeoutCancels", func(t *testing.T) {
		t.Parallel()
		forEachMode(t, testShutdownTimeoutCancels)
	})
}

// testShutdownInFlightFinishes holds a message's handler until the stop has begun: the consumer must
// let it finish, apply it and commit its offset before Run returns.
func testShutdownInFlightFinishes(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	entered, release, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	c, err := consumer.New(e.config(&recorder{
		fail: func(d inbox.Delivery) error {
			close(entered)
			<-release
			return nil
		},
		after: func(inbox.Delivery) { close(finished) },
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.produce("slow")
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("Run returned before the handler ran: %v", err)
	}

	cancel() // the stop begins while the handler is held
	close(release)
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case <-finished:
	default:
		t.Error("Run returned before the in-flight handler finished")
	}
	if c.Ready() {
		t.Error("Ready() = true after Run returned")
	}
	if got := e.effects()["slow"]; got != 1 {
		t.Errorf("the in-flight message was applied %d times, want once", got)
	}
	if got := e.committed(); got != 1 {
		t.Errorf("committed %d offsets, want the in-flight message's", got)
	}
}

func testShutdownTimeoutCancels(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	entered := make(chan struct{})
	causes := make(chan error, 1)
	config := e.config(nil)
	config.ShutdownTimeout = 100 * time.Millisecond
	// A handler that waits for its context: only the cancellation at the timeout ends it.
	config.Routes[0].Handler = handlerFunc(func(ctx context.Context, d inbox.Delivery) error {
		close(entered)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	_, stop := e.start(config)
	e.produce("stuck")
	<-entered
	stop()
	if cause := <-causes; !errors.Is(cause, consumer.ErrStopped) {
		t.Errorf("the handler's context was cancelled with cause %v, want ErrStopped", cause)
	}
	if len(e.effects()) != 0 || len(e.inboxKeys()) != 0 || e.committed() != 0 {
		t.Errorf("the cancelled message left effects %v, inbox keys %v, or a commit (%d)",
			e.effects(), e.inboxKeys(), e.committed())
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("the cancelled message was dead-lettered: %v", kafkatest.Header(dead[0], deadletter.HeaderReason))
	}
}

// handlerFunc is a handler that records nothing.
type handlerFunc func(ctx context.Context, d inbox.Delivery) error

func (f handlerFunc) Handle(ctx context.Context, _ pgx.Tx, d inbox.Delivery) error { return f(ctx, d) }

func (f handlerFunc) HandleBatch(ctx context.Context, tx pgx.Tx, ds []inbox.Delivery) []error {
	return handleEach(ctx, tx, ds, f.Handle)
}

// TestDeadLetterTopicUnavailable checks that a message whose dead letter cannot be written holds its
// partition, uncommitted, until the dead-letter topic can be written.
func TestDeadLetterTopicUnavailable(t *testing.T) {
	t.Parallel()
	forEachMode(t, testDeadLetterTopicUnavailable)
}

func testDeadLetterTopicUnavailable(t *testing.T, mode testMode) {
	e := &env{t: t, mode: mode, kafka: kafkatest.Start(t, 1, topic), db: pgtest.Schema(t), partitions: 1, log: testlog.New(t)}
	if _, err := e.db.Pool.Exec(t.Context(), effectsTable); err != nil {
		t.Fatal(err)
	}
	attempted := make(chan struct{})
	var once sync.Once // a batch's permanent failure is confirmed by a second run
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "bad" {
			once.Do(func() { close(attempted) })
			return fault.Permanent(inboxtype.InvalidPayload, errors.New("bad payload"))
		}
		return nil
	}})
	var dlqRequests atomic.Int64
	e.kafka.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		for _, t := range req.(*kmsg.MetadataRequest).Topics {
			if t.Topic != nil && *t.Topic == dlqTopic {
				dlqRequests.Add(1)
			}
		}
		return nil, nil, false
	})
	e.start(config)
	e.produceOrdered("order-1", "bad", "next")
	<-attempted

	// No dead-letter topic yet: the partition waits, trying again. Wait for evidence of tries: the
	// broker's requests naming the dead-letter topic.
	const tries = 3
	e.waitFor(fmt.Sprintf("%d requests for the dead-letter topic", tries), func() bool { return dlqRequests.Load() >= tries })
	if got := e.committed(); got != 0 {
		t.Fatalf("committed %d offsets without writing the dead letter", got)
	}
	if got := e.effects()["next"]; got != 0 {
		t.Fatal("the partition moved past a message it could not dead-letter")
	}

	createTopic(t, e.kafka.Addr, dlqTopic)
	e.waitFor("both offsets committed", func() bool { return e.committed() == 2 })
	if dead := e.deadLetters(); len(dead) != 1 || kafkatest.Header(dead[0], deadletter.HeaderReason) != string(inboxtype.InvalidPayload) {
		t.Errorf("dead letters = %v, want the bad message", dead)
	}
	checkOnce(t, e, []string{"next"})
}

func createTopic(t *testing.T, broker, name string) {
	t.Helper()
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(broker), Transport: transport}
	resp, err := client.CreateTopics(t.Context(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: 1, ReplicationFactor: 1}},
	})
	if err == nil {
		err = resp.Errors[name]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

// TestLag checks the consumer_lag gauge while a partition is held up and after it caught up.
func TestLag(t *testing.T) {
	t.Parallel()
	forEachMode(t, testLag)
}

func testLag(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	release := make(chan struct{})
	config := e.config(&recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "first" {
			<-release
		}
		return nil
	}})
	config.LagInterval = 50 * time.Millisecond
	e.start(config)
	e.produce(append([]string{"first"}, keys("then", 9)...)...)
	lag := config.Metrics.Lag.WithLabelValues(topic, "0")
	e.waitFor("a lag of 10", func() bool { return testutil.ToFloat64(lag) == 10 })
	close(release)
	e.waitFor("no lag", func() bool { return testutil.ToFloat64(lag) == 0 })
}

// TestOffsetCommitFails makes the broker refuse every offset commit of a first consumer: the
// message it applied stays uncommitted, so a second consumer gets it again and skips it as a
// duplicate. A failed commit neither loses a message nor applies one twice.
func TestOffsetCommitFails(t *testing.T) {
	t.Parallel()
	forEachMode(t, testOffsetCommitFails)
}

func testOffsetCommitFails(t *testing.T, mode testMode) {
	e := setup(t, mode, 1)
	var refuse atomic.Bool
	var refused atomic.Int64
	refuse.Store(true)
	e.kafka.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return kafkatest.CommitError(-1)(req), nil, true // UNKNOWN_SERVER_ERROR
	})

	first := e.config(&recorder{})
	_, stop := e.start(first)
	e.produce("once")
	e.waitFor("a refused offset commit", func() bool { return refused.Load() >= 1 })
	stop()
	if got := e.effects()["once"]; got != 1 {
		t.Fatalf("the first consumer applied the message %d times, want once", got)
	}
	if got := e.committed(); got != 0 {
		t.Fatalf("committed %d offsets though every commit was refused", got)
	}

	refuse.Store(false)
	second := e.config(&recorder{})
	e.start(second)
	e.waitFor("the offset committed", func() bool { return e.committed() == 1 })
	checkOnce(t, e, []string{"once"})
	if got := outcomes(second, "duplicate"); got != 1 {
		t.Errorf("the second consumer counted %v duplicates, want 1: the redelivery of the uncommitted message", got)
	}
}

// TestOffsetCommitRecovers: commits refused for a while make the consumer not ready; once the
// broker takes them again, the consumer commits what it finished meanwhile though nothing more
// arrives, and is ready again.
func TestOffsetCommitRecovers(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	var refuse atomic.Bool
	refuse.Store(true)
	e.kafka.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		return kafkatest.CommitError(30)(req), nil, true // GROUP_AUTHORIZATION_FAILED
	})
	config := e.config(&recorder{})
	config.CommitFailureTimeout = 500 * time.Millisecond
	c, _ := e.start(config)
	e.produce(keys("c", 5)...)
	e.waitFor("the commits failing", func() bool {
		return testutil.ToFloat64(config.Metrics.CommitFailures.WithLabelValues(topic)) >= 1
	})
	e.waitFor("the consumer not ready", func() bool { return !c.Ready() })
	if err := c.NotReady(); err == nil || !strings.Contains(err.Error(), "offset commits have failed") {
		t.Errorf("NotReady = %v, want the failing commits", err)
	}
	if !slices.ContainsFunc(e.logs.All(), func(r testlog.Record) bool {
		return r.Message == "cannot commit the offset; messages from the last commit on will be delivered again" &&
			strings.Contains(r.Attrs["error"].String(), "Group Authorization Failed")
	}) {
		t.Error("no log of the failed commit naming the broker's error")
	}
	// Failing every second, the commits are said once (then once a minute): not a line each.
	e.waitFor("three commits failed", func() bool {
		return testutil.ToFloat64(config.Metrics.CommitFailures.WithLabelValues(topic)) >= 3
	})
	if n := countLogs(e.logs, "cannot commit the offset; messages from the last commit on will be delivered again"); n != 1 {
		t.Errorf("%d warnings of the failing commits, want 1 within a minute", n)
	}
	refuse.Store(false)
	e.waitFor("the offsets committed", func() bool { return e.committed() == 5 })
	e.waitFor("the consumer ready again", c.Ready)
	if n := countLogs(e.logs, "committing the offset again"); n != 1 {
		t.Errorf("%d logs of the commits going through again, want 1", n)
	}
}

// countLogs counts the records of logs with message msg.
func countLogs(logs *testlog.Records, msg string) int {
	n := 0
	for _, r := range logs.All() {
		if r.Message == msg {
			n++
		}
	}
	return n
}

// TestOffsetCommitConnectionClosed: a broker that closes the connection on every offset commit
// (as a Kafka 4 broker does to a request version it no longer serves) does not make the consumer
// leave its group. Its commits are tried again in the generation that assigned the partition; the
// membership, its heartbeats, goes on: not one JoinGroup more while commits fail, and what was
// applied meanwhile is committed once the broker takes commits again.
func TestOffsetCommitConnectionClosed(t *testing.T) {
	t.Parallel()
	e := setup(t, testMode{consumer.PerMessage, consumer.ByKey}, 1)
	var refuse atomic.Bool
	var refused, joins atomic.Int64
	e.kafka.ControlKey(int16(kmsg.JoinGroup), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		joins.Add(1)
		return nil, nil, false
	})
	e.kafka.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return nil, errors.New("closing the connection"), true
	})
	config := e.config(&recorder{})
	c, _ := e.start(config)
	e.produce("before")
	e.waitFor("the first offset committed", func() bool { return e.committed() == 1 })
	e.waitFor("the consumer ready", c.Ready)
	joined := joins.Load()

	refuse.Store(true)
	e.produce(keys("during", 5)...)
	e.waitFor("three commits refused", func() bool { return refused.Load() >= 3 })
	refuse.Store(false)
	e.waitFor("the offsets committed", func() bool { return e.committed() == 6 })
	if n := joins.Load() - joined; n != 0 {
		t.Errorf("%d JoinGroup requests while commits were refused, want 0: a failed commit is no reason to leave the group", n)
	}
	if got := outcomes(config, "duplicate"); got != 0 {
		t.Errorf("%v duplicates: messages were delivered again though the consumer kept its partition", got)
	}
}
