package main_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestSMSCrashAfterProviderAccepted kills the worker (SIGKILL) after the SMS provider has accepted a
// message and before the worker committed it. The next worker, once the dead one's lease on the key
// has expired, sends it again with the same Idempotency-Key, so the provider, which honours the key,
// delivers it once; the notification is recorded once.
func TestSMSCrashAfterProviderAccepted(t *testing.T) {
	t.Parallel()
	cluster := startBroker(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)

	// The first delivery is held between the provider's acceptance and its answer until released.
	delivered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	provider.SetOnDelivered(func(ctx context.Context, _ notifytest.Request) {
		once.Do(func() { close(delivered) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	})

	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=crash",
		"KAFKA_SESSION_TIMEOUT=500ms", // the dead worker's partitions are handed on quickly
		"DATABASE_URL=" + db.URL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"SHUTDOWN_TIMEOUT=10s",
	}
	first := startWorker(t, env, "run")
	const key = "sms-crash"
	produce(t, cluster.Addr, topicSMS, sms(key, "+8613800138000"))

	select {
	case <-delivered:
	case <-time.After(waitTimeout):
		t.Fatal("the provider never received the SMS")
	}
	first.signal(syscall.SIGKILL)
	first.wait()
	close(release)
	if n := countNotifications(t, db.Pool, key); n != 0 {
		t.Fatalf("%d notifications committed by the killed worker, want 0", n)
	}

	expireLeases(t, db.Pool, 1)
	second := startWorker(t, env, "run")
	eventually(t, func() string {
		if countNotifications(t, db.Pool, key) != 1 {
			return "the second worker did not record the notification"
		}
		return ""
	})
	second.signal(syscall.SIGTERM)
	if code := second.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}

	// The send and the resend; one more for each resend a rebalance of the second worker abandoned
	// while it was out (the next owner sends again once that send's lease has expired).
	if calls := provider.Calls(key); calls < 2 || provider.MostConcurrent(key) != 1 {
		t.Errorf("the provider got %d requests with key %s, at most %d at once; want 2 or more (the send and the resend), one at a time",
			calls, key, provider.MostConcurrent(key))
	}
	if n := len(provider.Delivered()); n != 1 {
		t.Errorf("the provider delivered %d messages, want 1", n)
	}
	var messageID string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT provider_message_id FROM notifications WHERE idempotency_key = $1`, key).Scan(&messageID)
	if err != nil {
		t.Fatal(err)
	}
	if messageID != provider.MessageID(key) {
		t.Errorf("recorded provider message id %q, the provider's is %q", messageID, provider.MessageID(key))
	}
	if committed := cluster.CommittedOffset(t, "crash", topicSMS, 0); committed != 1 {
		t.Errorf("committed offset %d, want 1", committed)
	}
}

// TestSMSCrashWithSendsInFlight kills the worker (SIGKILL) with 64 sends out at once, each accepted
// by the provider and not answered yet. The SMS topic has 64 partitions, since a partition has one
// message in flight at a time; each partition's first message was sent and committed before.
//
// While the sends are out, the worker's sessions in pg_stat_activity never exceed its pool and none
// is in a transaction. When it dies, no partition's committed offset is past its unfinished message.
// The next worker takes the expired leases over and sends again with the same keys: each SMS is
// delivered once, no key is ever called while a call of it is out, and each is recorded once.
func TestSMSCrashWithSendsInFlight(t *testing.T) {
	t.Parallel()
	const inFlight, poolSize = 64, 4
	cluster := startBroker(t, 1, topicPayments, topicPayments+".dlq", topicSMS+".dlq")
	createTopic(t, cluster.Addr, topicSMS, inFlight)
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)

	// The second message of each partition is held between the provider's acceptance and its
	// answer, until the worker that sent it dies.
	provider.SetOnDelivered(func(ctx context.Context, r notifytest.Request) {
		if r.Key[:6] == "second" {
			<-ctx.Done()
		}
	})

	app := fmt.Sprintf("worker_crash_%d", time.Now().UnixNano())
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	q.Set("pool_max_conns", fmt.Sprint(poolSize))
	u.RawQuery = q.Encode()
	env := []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=crash-in-flight",
		"KAFKA_SESSION_TIMEOUT=2s",
		"DATABASE_URL=" + u.String(),
		"SMS_PROVIDER_URL=" + provider.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"SHUTDOWN_TIMEOUT=10s",
	}
	first := startWorker(t, env, "run")

	// One phone per partition: a phone's messages go to one partition.
	var keys []string
	var firsts, seconds []kafka.Message
	for p := range inFlight {
		phone := phoneOfPartition(p, inFlight)
		firsts = append(firsts, sms(fmt.Sprintf("first-%02d", p), phone))
		seconds = append(seconds, sms(fmt.Sprintf("second-%02d", p), phone))
		keys = append(keys, fmt.Sprintf("first-%02d", p), fmt.Sprintf("second-%02d", p))
	}
	produce(t, cluster.Addr, topicSMS, firsts...)
	eventually(t, func() string {
		if n := committedOn(t, cluster.Addr, "crash-in-flight", topicSMS, inFlight); n != inFlight {
			return fmt.Sprintf("%d of the %d first messages committed", n, inFlight)
		}
		return ""
	})
	produce(t, cluster.Addr, topicSMS, seconds...)

	peakSessions := 0
	eventually(t, func() string {
		total, _ := sessionsOf(t, db.Pool, app)
		peakSessions = max(peakSessions, total)
		if n := provider.InFlight(); n != inFlight {
			return fmt.Sprintf("%d of %d sends out", n, inFlight)
		}
		return ""
	})
	// The sends stay out until the worker dies: look at its sessions a few times meanwhile.
	for range 20 {
		total, idleInTx := sessionsOf(t, db.Pool, app)
		peakSessions = max(peakSessions, total)
		if idleInTx != 0 {
			t.Fatalf("%d sessions of the worker idle in a transaction with %d sends out", idleInTx, inFlight)
		}
	}
	if peakSessions > poolSize {
		t.Errorf("the worker had %d sessions, more than its pool of %d", peakSessions, poolSize)
	}
	first.signal(syscall.SIGKILL)
	first.wait()

	for p := range inFlight {
		if committed := cluster.CommittedOffset(t, "crash-in-flight", topicSMS, p); committed != 1 {
			t.Errorf("partition %d: committed offset %d after the crash, want 1 (the held message is at 1)", p, committed)
		}
	}
	if n := countAllNotifications(t, db.Pool); n != inFlight {
		t.Fatalf("%d notifications after the crash, want %d (the first messages')", n, inFlight)
	}

	expireLeases(t, db.Pool, inFlight)
	second := startWorker(t, env, "run")
	eventually(t, func() string {
		if n := countAllNotifications(t, db.Pool); n != 2*inFlight {
			return fmt.Sprintf("%d of %d notifications recorded", n, 2*inFlight)
		}
		return ""
	})
	second.signal(syscall.SIGTERM)
	if code := second.wait(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}

	delivered := map[string]int{}
	for _, r := range provider.Delivered() {
		delivered[r.Key]++
	}
	for _, key := range keys {
		if delivered[key] != 1 || provider.MostConcurrent(key) != 1 {
			t.Errorf("key %s: delivered %d times, called %d at once at most; want 1 and 1", key, delivered[key],
				provider.MostConcurrent(key))
		}
		// The send the crash cut off and the resend, for the second messages; a send abandoned by a
		// rebalance (a worker slow to heartbeat on a busy machine) adds one, after its lease.
		wantCalls := 1
		if key[:6] == "second" {
			wantCalls = 2
		}
		if calls := provider.Calls(key); calls < wantCalls {
			t.Errorf("key %s: %d calls, want %d or more", key, calls, wantCalls)
		}
		var messageID string
		err := db.Pool.QueryRow(context.Background(),
			`SELECT provider_message_id FROM notifications WHERE idempotency_key = $1`, key).Scan(&messageID)
		if err != nil || messageID != provider.MessageID(key) {
			t.Errorf("key %s: recorded provider message id %q (%v), the provider's is %q", key, messageID, err, provider.MessageID(key))
		}
	}
	if n := len(provider.Delivered()); n != 2*inFlight {
		t.Errorf("the provider delivered %d messages, want %d", n, 2*inFlight)
	}
	var leases int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM inbox_leases`).Scan(&leases); err != nil || leases != 0 {
		t.Errorf("%d leases left (%v), want none", leases, err)
	}
	if n := committedOn(t, cluster.Addr, "crash-in-flight", topicSMS, inFlight); n != 2*inFlight {
		t.Errorf("committed %d messages, want %d", n, 2*inFlight)
	}
}

// createTopic creates topic with n partitions.
func createTopic(t *testing.T, brokers, topic string, n int) {
	t.Helper()
	resp, err := kafkaClient(t, brokers).CreateTopics(context.Background(), &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: n, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// committedOn returns the sum of the offsets group has committed on topic's n partitions.
func committedOn(t *testing.T, brokers, group, topic string, n int) int64 {
	t.Helper()
	partitions := make([]int, n)
	for i := range partitions {
		partitions[i] = i
	}
	resp, err := kafkaClient(t, brokers).OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: partitions}})
	if err == nil {
		err = resp.Error
	}
	if errors.Is(err, kafka.GroupIdNotFound) {
		return 0 // nothing committed yet
	}
	if err != nil {
		t.Fatalf("committed offsets of %s: %v", topic, err)
	}
	var total int64
	for _, p := range resp.Topics[topic] {
		if p.CommittedOffset > 0 {
			total += p.CommittedOffset
		}
	}
	return total
}

// sessionsOf returns how many sessions of application app pg_stat_activity shows, and how many of
// them are idle in a transaction.
func sessionsOf(t *testing.T, pool *pgxpool.Pool, app string) (total, idleInTx int) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `
		SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
		FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&total, &idleInTx)
	if err != nil {
		t.Fatal(err)
	}
	return total, idleInTx
}

// phoneOfPartition returns a phone number that producers (kafka-go's Hash balancer, keyed by phone)
// send to partition p of n.
func phoneOfPartition(p, n int) string {
	partitions := make([]int, n)
	for i := range partitions {
		partitions[i] = i
	}
	for i := 0; ; i++ {
		phone := fmt.Sprintf("+86138%08d", i)
		if (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(phone)}, partitions...) == p {
			return phone
		}
	}
}

// expireLeases lets the time of the dead worker's leases on its sends run out (15 s by default)
// at once, so that the next worker takes them over without the test waiting for them; it checks the
// dead worker left exactly want of them live: one per send it had out.
func expireLeases(t *testing.T, pool *pgxpool.Pool, want int) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE inbox_leases SET expires_at = now() WHERE expires_at > now()`)
	if err != nil {
		t.Fatal(err)
	}
	if n := tag.RowsAffected(); n != int64(want) {
		t.Fatalf("the killed worker left %d live leases, want %d", n, want)
	}
}

func countAllNotifications(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func countNotifications(t *testing.T, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM notifications WHERE idempotency_key = $1`, key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
