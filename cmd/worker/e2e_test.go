package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
)

const (
	retentionWarning = "inbox retention is shorter than the topic's retention"

	topicPayments = "payments.callbacks"
	topicSMS      = "notifications.sms"
	partitions    = 2
)

// environment is where the worker under test runs: a Kafka cluster and a Postgres database.
type environment struct {
	brokers     string
	databaseURL string
	// pool reaches the database the worker uses, to set it up and check its effects.
	pool *pgxpool.Pool
	// sessionTimeout is the shortest group session timeout the brokers accept.
	sessionTimeout string
	// startupTimeout gives the worker time to reach the dependencies.
	startupTimeout string
}

// embeddedEnvironment is an in-process broker (kfake) and a fresh schema on the local Postgres.
func embeddedEnvironment(t *testing.T) *environment {
	cluster := startBroker(t, partitions, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	return &environment{brokers: cluster.Addr, databaseURL: db.URL, pool: db.Pool,
		sessionTimeout: "1s", startupTimeout: "10s"}
}

// execModeEnvironment is embeddedEnvironment with the worker's connections in one of pgx's
// query exec modes (default_query_exec_mode in DATABASE_URL) other than its default.
func execModeEnvironment(mode string) func(t *testing.T) *environment {
	return func(t *testing.T) *environment {
		env := embeddedEnvironment(t)
		env.databaseURL += "&default_query_exec_mode=" + mode
		return env
	}
}

// containerEnvironment is real Kafka (KRaft) and Postgres in containers, when a Docker engine answers.
func containerEnvironment(t *testing.T) *environment {
	ctx := context.Background()
	if err := dockerHealth(ctx); err != nil {
		t.Skipf("no Docker engine answers, so no real Kafka and Postgres: %s", oneLine(err.Error()))
	}
	kafkaC, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.5.0", tckafka.WithClusterID("inboxworker-test"))
	testcontainers.CleanupContainer(t, kafkaC)
	if err != nil {
		t.Fatalf("start Kafka: %v", err)
	}
	brokers, err := kafkaC.Brokers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pgC, err := tcpostgres.Run(ctx, "postgres:16-alpine", tcpostgres.WithDatabase("inboxworker"),
		tcpostgres.WithUsername("worker"), tcpostgres.WithPassword("s3cret"), tcpostgres.BasicWaitStrategies())
	testcontainers.CleanupContainer(t, pgC)
	if err != nil {
		t.Fatalf("start Postgres: %v", err)
	}
	url, err := pgC.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	createTopics(t, brokers[0], topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	// A real broker's group.min.session.timeout.ms is 6s.
	return &environment{brokers: strings.Join(brokers, ","), databaseURL: url, pool: pool,
		sessionTimeout: "6s", startupTimeout: "60s"}
}

func dockerHealth(ctx context.Context) error {
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	defer provider.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return provider.Health(ctx)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestEndToEnd runs `worker run` against Kafka and Postgres, produces a mixed stream and checks
// the effects, the endpoints and the metrics, then stops the worker with SIGTERM: it exits 0 having
// committed every offset. The same test runs against the in-process broker and, when Docker is
// available, against real Kafka and Postgres in containers.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, env := range []struct {
		name  string
		start func(*testing.T) *environment
	}{
		{"Embedded", embeddedEnvironment},
		// Every statement's parameters carry their types, so that each of pgx's other query exec
		// modes works too: those that describe nothing first (exec, simple_protocol) and those
		// a connection pooler in transaction mode needs (cache_describe).
		{"Embedded/exec", execModeEnvironment("exec")},
		{"Embedded/simple_protocol", execModeEnvironment("simple_protocol")},
		{"Embedded/describe_exec", execModeEnvironment("describe_exec")},
		{"Embedded/cache_describe", execModeEnvironment("cache_describe")},
		// Behind a connection pooler in transaction mode, the modes that describe nothing or keep
		// what they describe on the client; the other two are refused at start (TestBehindPooler).
		{"PgBouncer/cache_describe", poolerEnvironment("cache_describe")},
		{"PgBouncer/exec", poolerEnvironment("exec")},
		{"PgBouncer/simple_protocol", poolerEnvironment("simple_protocol")},
		{"Containers", containerEnvironment},
	} {
		t.Run(env.name, func(t *testing.T) {
			t.Parallel()
			testEndToEnd(t, env.start(t))
		})
	}
}

func testEndToEnd(t *testing.T, env *environment) {
	ctx := context.Background()
	provider := notifytest.NewProvider(t)
	provider.RequireToken("sms-s3cret")
	// The provider refuses one number, echoing it and the token in a long answer: the dead letter
	// must carry that answer cut short, without them.
	provider.SetHook(func(r notifytest.Request) notifytest.Reply {
		if r.Key == "sms-e4" {
			return notifytest.Reply{Status: 422, Body: `{"error":"+447700900999 is blocked","auth":"Bearer sms-s3cret","trace":"` +
				strings.Repeat("x", 20000) + `"}`}
		}
		return notifytest.Reply{}
	})
	group := "e2e-" + strings.ReplaceAll(t.Name(), "/", "-")
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + env.brokers,
		"KAFKA_GROUP_ID=" + group,
		"KAFKA_SESSION_TIMEOUT=" + env.sessionTimeout,
		"DATABASE_URL=" + env.databaseURL,
		"SMS_PROVIDER_URL=" + provider.URL,
		"SMS_PROVIDER_TOKEN=sms-s3cret",
		"HTTP_ADDR=127.0.0.1:0",
		"RETRY_INITIAL_INTERVAL=10ms",
		"RETRY_MAX_INTERVAL=100ms",
		"RETRY_MAX_ELAPSED=1m", // E-5's callback waits for its order, however slow the machine
		"SHUTDOWN_TIMEOUT=10s",
		"STARTUP_TIMEOUT=" + env.startupTimeout,
		// Set shorter than the topics' retention on purpose: the worker must warn.
		"INBOX_RETENTION_PAYMENTS=72h",
		"INBOX_RETENTION_SMS=24h",
		"LAG_INTERVAL=100ms", // the lag below comes down to 0 without waiting for the default 5s
	}, "run")
	base := p.httpAddr()

	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d, want 200", code)
	}
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})
	// Both brokers keep messages 7 days by default, longer than the inbox keys' explicit 72h and 24h.
	for _, setting := range []string{"INBOX_RETENTION_PAYMENTS", "INBOX_RETENTION_SMS"} {
		if w := p.findLog(retentionWarning, "setting", setting); w == nil || w["topic_retention"] != "168h0m0s" {
			t.Errorf("no warning that %s is shorter than the topic's 7 days: %v", setting, w)
		}
	}

	// The worker has migrated the database by now; the order service's orders come first.
	_, err := env.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency, status) VALUES
		('E-1', 'u-1', 10.00, 'CNY', 'PENDING'),
		('E-2', 'u-2', 20.00, 'CNY', 'PENDING'),
		('E-3', 'u-3', 30.00, 'CNY', 'CANCELLED')`)
	if err != nil {
		t.Fatal(err)
	}
	paid := payment("pe-1", "E-1", "T-1", "10.00", "SUCCESS")
	paid.Headers = []kafka.Header{{Key: "Idempotency-Key", Value: []byte("pe-1")}}
	failed := payment("pe-2", "E-2", "T-2", "20.00", "FAILED")
	failed.Headers = []kafka.Header{{Key: "X-Idempotent-Key", Value: []byte("pe-2")}}
	badJSON := kafka.Message{Key: []byte("E-4"), Value: []byte(`{"event_id":"pe-bad","order_no":`),
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte("pe-bad")}}}
	produce(t, env.brokers, topicPayments,
		paid, paid, // a redelivery
		failed,
		payment("pe-3", "E-3", "T-3", "30.00", "SUCCESS"), // the key from event_id; a cancelled order
		payment("pe-5", "E-5", "T-5", "50.00", "SUCCESS"), // the order is created once this is retried
		badJSON,
	)
	code := sms("sms-e1", "+8613800138000")
	produce(t, env.brokers, topicSMS,
		code, code,
		sms("sms-e2", "8613800138000"), // not E.164
		sms("sms-e3", "+447700900123"),
		sms("sms-e4", "+447700900999"), // refused by the provider
	)
	eventually(t, func() string {
		if retries := counter(scrape(t, base), "inboxworker_retries_total", topicPayments); retries == 0 {
			return "the callback of the order not yet created was not retried"
		}
		return ""
	})
	if _, err := env.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency) VALUES ('E-5', 'u-5', 50.00, 'CNY')`); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]float64{
		topicPayments: {"applied": 4, "duplicate": 1, "dead_lettered": 1},
		topicSMS:      {"applied": 2, "duplicate": 1, "dead_lettered": 2},
	}

	var metrics map[string]*dto.MetricFamily // parsed below, once every message is finished
	eventually(t, func() string {
		metrics = scrape(t, base)
		got := messagesTotal(metrics)
		for topic, outcomes := range want {
			for outcome, n := range outcomes {
				if got[topic][outcome] != n {
					return fmt.Sprintf("inboxworker_messages_total: %v, want %v", got, want)
				}
			}
			// Counted and timed one after the other: a scrape may fall between the two.
			handled := outcomes["applied"] + outcomes["duplicate"] + outcomes["dead_lettered"]
			if n := handleCount(metrics, topic); n != handled {
				return fmt.Sprintf("inboxworker_handle_seconds_count{topic=%q} = %v, want %v", topic, n, handled)
			}
		}
		return ""
	})
	for _, name := range []string{"inboxworker_handle_seconds", "go_goroutines", "process_cpu_seconds_total"} {
		if metrics[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	// The lag is refreshed every LAG_INTERVAL; every partition's must come down to 0.
	eventually(t, func() string {
		lag := gauges(scrape(t, base), "inboxworker_consumer_lag")
		if len(lag) != 2*partitions {
			return fmt.Sprintf("inboxworker_consumer_lag has %d series, want %d", len(lag), 2*partitions)
		}
		for series, v := range lag {
			if v != 0 {
				return fmt.Sprintf("inboxworker_consumer_lag%s = %v, want 0", series, v)
			}
		}
		return ""
	})
	if code, body := get(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s, want 200", code, body)
	}

	checkEffects(t, env.pool, provider)
	for topic, want := range map[string][]string{
		topicPayments: {"invalid_payload"},
		topicSMS:      {"invalid_payload", "provider_rejected"},
	} {
		dead := deadLetters(t, env.brokers, topic+".dlq")
		var reasons []string
		for _, d := range dead {
			reasons = append(reasons, d.reason)
			if d.originalTopic != topic {
				t.Errorf("dead letter %+v: dlq-original-topic %q, want %q", d, d.originalTopic, topic)
			}
			// The dead letter itself, not only the logs: the error, bounded, without a full number
			// or the token.
			if d.error == "" || len(d.error) > 8<<10 || strings.Contains(d.error, "13800138000") ||
				strings.Contains(d.error, "447700900999") || strings.Contains(d.error, "s3cret") {
				t.Errorf("dead letter of %s (%s): dlq-error of %d bytes %.300q; want the error, at most 8 KiB, without a full number or the token",
					topic, d.reason, len(d.error), d.error)
			}
		}
		slices.Sort(reasons)
		if !slices.Equal(reasons, want) {
			t.Errorf("dead letters of %s: %v, want %v", topic, reasons, want)
		}
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	p.waitLog("stopped")
	for topic, n := range map[string]int64{topicPayments: 6, topicSMS: 5} {
		if committed := committedTotal(t, env.brokers, group, topic); committed != n {
			t.Errorf("%s: the group committed %d offsets, want all %d", topic, committed, n)
		}
	}
	// A message's log lines say where it came from and which key it carries.
	for _, topic := range []string{topicPayments, topicSMS} {
		l := p.findLog("dead-lettered the message", "topic", topic)
		if l == nil {
			t.Errorf("no log line for the dead letter of %s", topic)
			continue
		}
		for _, attr := range []string{"partition", "offset", "key", "reason"} {
			if _, ok := l[attr]; !ok {
				t.Errorf("the dead letter's log line has no %s: %v", attr, l)
			}
		}
	}
	_, lines := p.output()
	for _, l := range lines {
		if strings.Contains(l, "s3cret") || strings.Contains(l, "13800138000") || strings.Contains(l, "447700900999") {
			t.Errorf("a secret or a full phone number in the logs: %s", l)
		}
		// Nothing in this stream makes Postgres refuse a statement.
		if strings.Contains(l, "SQLSTATE") {
			t.Errorf("Postgres refused a statement: %s", l)
		}
	}
}

func checkEffects(t *testing.T, pool *pgxpool.Pool, provider *notifytest.Provider) {
	t.Helper()
	ctx := context.Background()
	var (
		status, txn            string
		payments, anomalies    int
		notifications, inboxes int
	)
	for order, wantTxn := range map[string]string{"E-1": "T-1", "E-5": "T-5"} {
		err := pool.QueryRow(ctx, `SELECT status, coalesce(provider_txn_id, '') FROM orders WHERE order_no = $1`,
			order).Scan(&status, &txn)
		if err != nil {
			t.Fatal(err)
		}
		if status != "PAID" || txn != wantTxn {
			t.Errorf("order %s is %s by %q, want PAID by %s", order, status, txn, wantTxn)
		}
	}
	err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM payments),
		(SELECT count(*) FROM payment_anomalies WHERE order_no = 'E-3' AND kind = 'paid_after_cancel'),
		(SELECT count(*) FROM notifications WHERE status = 'SENT'),
		(SELECT count(*) FROM inbox)`).Scan(&payments, &anomalies, &notifications, &inboxes)
	if err != nil {
		t.Fatal(err)
	}
	if payments != 3 || anomalies != 1 || notifications != 2 || inboxes != 6 {
		t.Errorf("payments %d, paid_after_cancel anomalies %d, notifications %d, inbox rows %d; want 3, 1, 2, 6",
			payments, anomalies, notifications, inboxes)
	}
	if n := len(provider.Delivered()); n != 2 {
		t.Errorf("the provider delivered %d SMS, want 2", n)
	}
	for _, key := range []string{"sms-e1", "sms-e3"} {
		if calls := provider.Calls(key); calls != 1 {
			t.Errorf("the provider got %d requests for %s, want 1", calls, key)
		}
	}
}

func payment(key, orderNo, txn, amount, result string) kafka.Message {
	v, _ := json.Marshal(map[string]string{"event_id": key, "order_no": orderNo, "provider": "wechat",
		"provider_txn_id": txn, "amount": amount, "currency": "CNY", "result": result, "paid_at": "2025-06-01T12:00:00Z"})
	return kafka.Message{Key: []byte(orderNo), Value: v}
}

func sms(key, phone string) kafka.Message {
	v, _ := json.Marshal(map[string]any{"event_id": key, "phone": phone, "template": "verify_code",
		"params": map[string]string{"code": "424242"}})
	return kafka.Message{Key: []byte(phone), Value: v}
}

// kafkaClient returns a kafka-go client of brokers with a transport of its own, closed with the test.
func kafkaClient(t *testing.T, brokers string) *kafka.Client {
	transport := &kafka.Transport{ClientID: kafkatest.ClientID}
	t.Cleanup(transport.CloseIdleConnections)
	return &kafka.Client{Addr: kafka.TCP(strings.Split(brokers, ",")...), Transport: transport, Timeout: 10 * time.Second}
}

func createTopics(t *testing.T, brokers string, topics ...string) {
	t.Helper()
	req := &kafka.CreateTopicsRequest{}
	for _, topic := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
	}
	resp, err := kafkaClient(t, brokers).CreateTopics(context.Background(), req)
	if err == nil {
		for _, e := range resp.Errors {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
}

// produce writes msgs to topic, each to the partition of its key.
func produce(t *testing.T, brokers, topic string, msgs ...kafka.Message) {
	t.Helper()
	transport := &kafka.Transport{ClientID: kafkatest.ClientID}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(strings.Split(brokers, ",")...), Transport: transport, Topic: topic,
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchSize: len(msgs), BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// committedTotal returns the sum of the offsets group has committed on topic's partitions: the
// number of messages it finished, since every partition starts at 0.
func committedTotal(t *testing.T, brokers, group, topic string) int64 {
	t.Helper()
	resp, err := kafkaClient(t, brokers).OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{
		GroupID: group, Topics: map[string][]int{topic: {0, 1}}})
	if err == nil {
		err = resp.Error
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

type deadLetter struct{ reason, originalTopic, error string }

// deadLetters reads every message of a dead-letter topic.
func deadLetters(t *testing.T, brokers, topic string) []deadLetter {
	t.Helper()
	ctx := context.Background()
	client := kafkaClient(t, brokers)
	var out []deadLetter
	for p := range partitions {
		for offset := int64(0); ; {
			resp, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: p, Offset: offset,
				MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 10 * time.Millisecond})
			if err == nil {
				err = resp.Error
			}
			if err != nil {
				t.Fatalf("read %s/%d: %v", topic, p, err)
			}
			for {
				r, err := resp.Records.ReadRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("read %s/%d: %v", topic, p, err)
				}
				var d deadLetter
				for _, h := range r.Headers {
					switch h.Key {
					case deadletter.HeaderReason:
						d.reason = string(h.Value)
					case deadletter.HeaderOriginalTopic:
						d.originalTopic = string(h.Value)
					case "dlq-error":
						d.error = string(h.Value)
					}
				}
				out = append(out, d)
				offset = r.Offset + 1
			}
			if offset >= resp.HighWatermark {
				break
			}
		}
	}
	return out
}

// scrape parses /metrics.
func scrape(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// messagesTotal returns inboxworker_messages_total by topic and outcome.
func messagesTotal(families map[string]*dto.MetricFamily) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	for _, m := range families["inboxworker_messages_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if out[labels["topic"]] == nil {
			out[labels["topic"]] = map[string]float64{}
		}
		out[labels["topic"]][labels["outcome"]] = m.GetCounter().GetValue()
	}
	return out
}

// counter returns the value of the named counter for topic.
func counter(families map[string]*dto.MetricFamily, name, topic string) float64 {
	for _, m := range families[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "topic" && l.GetValue() == topic {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// gauges returns the named gauge's series, keyed by their labels.
func gauges(families map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range families[name].GetMetric() {
		out[fmt.Sprint(m.GetLabel())] = m.GetGauge().GetValue()
	}
	return out
}

func handleCount(families map[string]*dto.MetricFamily, topic string) float64 {
	for _, m := range families["inboxworker_handle_seconds"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "topic" && l.GetValue() == topic {
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
