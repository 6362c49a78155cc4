package main_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/tracing"
	"github.com/inboxworker/inboxworker/internal/tracing/tracingtest"
)

// A producer's span, as the traceparent header of a message it produced carries it.
type producerSpan struct{ traceID, spanID string }

func (p producerSpan) header() kafka.Header {
	return kafka.Header{Key: "traceparent", Value: []byte(tracingtest.Traceparent(p.traceID, p.spanID))}
}

// The producers' spans of the test's messages.
var (
	smsProducer     = producerSpan{"0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"}
	badSMSProducer  = producerSpan{"4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"}
	paymentProducer = [2]producerSpan{
		{"5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"},
		{"6e0c63257de34c92bf9efcd03927272e", "5fb397be34d26b51"},
	}
)

const tracedPhone = "+8613800138000"

// TestTracingEndToEnd runs `worker run` with tracing on through OTEL_EXPORTER_OTLP_ENDPOINT,
// pointed at an OTLP/HTTP endpoint of the test, and an HTTP SMS provider. It sends an SMS, a bad
// SMS and two payment callbacks, each with a producer's traceparent, then stops the worker with
// SIGTERM. The spans are exported only by the flush at shutdown (OTEL_BSP_SCHEDULE_DELAY is ten
// minutes): none arrives before, and the provider request's span arrives after, as a client span of
// the service OTEL_SERVICE_NAME names, whose trace context is the traceparent the provider got. No
// span carries the full phone number.
//
// ConsumerSpans checks the consumer's own spans: a consumer span per message, child of its
// traceparent, without its Kafka key; a batch transaction's span linked to its messages; the dead
// letter's traceparent.
func TestTracingEndToEnd(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t, 1, topicPayments, topicSMS, topicPayments+".dlq", topicSMS+".dlq")
	db := pgtest.Schema(t)
	provider := notifytest.NewProvider(t)
	collector := tracingtest.NewCollector(t)
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + cluster.Addr,
		"KAFKA_GROUP_ID=tracing",
		"DATABASE_URL=" + db.URL,
		"HTTP_ADDR=127.0.0.1:0",
		"SMS_PROVIDER_URL=" + provider.URL,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL,
		"OTEL_SERVICE_NAME=inboxworker-e2e",
		"OTEL_BSP_SCHEDULE_DELAY=600000", // ms: the spans leave at shutdown, whose flush is tested
	}, "run")
	if l := p.waitLog("tracing is on: exporting spans over OTLP/HTTP"); l["endpoint"] != collector.URL+"/v1/traces" {
		t.Errorf("tracing exports to %v, want %s/v1/traces", l["endpoint"], collector.URL)
	}
	base := p.httpAddr()
	eventually(t, func() string {
		if code, body := get(t, base+"/readyz"); code != 200 {
			return fmt.Sprintf("/readyz: %d %s", code, body)
		}
		return ""
	})

	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO orders (order_no, user_id, amount, currency, status)
		VALUES ('TR-1', 'u-1', 10.00, 'CNY', 'PENDING'), ('TR-2', 'u-2', 20.00, 'CNY', 'PENDING')`); err != nil {
		t.Fatal(err)
	}
	good, bad := sms("tr-sms-1", tracedPhone), sms("tr-sms-bad", "8613800138000")
	good.Headers = append(good.Headers, smsProducer.header())
	bad.Headers = append(bad.Headers, badSMSProducer.header())
	cluster.Produce(t, topicSMS, good, bad)
	pay := []kafka.Message{payment("tr-pay-1", "TR-1", "TT-1", "10.00", "SUCCESS"), payment("tr-pay-2", "TR-2", "TT-2", "20.00", "SUCCESS")}
	for i := range pay {
		pay[i].Headers = append(pay[i].Headers, paymentProducer[i].header())
	}
	cluster.Produce(t, topicPayments, pay...) // one write: a batch
	eventually(t, func() string {
		sms, payments := cluster.CommittedOffset(t, "tracing", topicSMS, 0), cluster.CommittedOffset(t, "tracing", topicPayments, 0)
		if sms != 2 || payments != 2 {
			return fmt.Sprintf("committed offsets: %d of 2 SMS, %d of 2 payments", sms, payments)
		}
		return ""
	})
	if spans := collector.Spans(); len(spans) != 0 {
		t.Errorf("%d spans exported before the shutdown, want none before the flush (OTEL_BSP_SCHEDULE_DELAY)", len(spans))
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	spans := collector.Spans()
	requests := provider.Requests()
	if len(requests) != 1 || requests[0].Key != "tr-sms-1" {
		t.Fatalf("the provider got %d requests, want the one of tr-sms-1", len(requests))
	}
	call := checkProviderSpan(t, spans, requests[0], provider.URL)
	checkNoPhone(t, spans)

	t.Run("ConsumerSpans", func(t *testing.T) {
		checkConsumerSpans(t, spans, call, cluster.ReadAll(t, topicSMS+".dlq", 0))
	})
}

// checkProviderSpan checks the span of the provider's request r, at providerURL, and returns it.
func checkProviderSpan(t *testing.T, spans []tracingtest.Span, r notifytest.Request, providerURL string) tracingtest.Span {
	t.Helper()
	if r.Traceparent == "" {
		t.Fatal("the provider got no traceparent")
	}
	var call *tracingtest.Span
	for i, s := range spans {
		if tracingtest.Traceparent(s.TraceID, s.SpanID) == r.Traceparent {
			call = &spans[i]
		}
	}
	if call == nil {
		t.Fatalf("no span exported has the trace context of the provider's traceparent %s (%d spans: %v)",
			r.Traceparent, len(spans), spanNames(spans))
	}
	u, err := url.Parse(providerURL)
	if err != nil {
		t.Fatal(err)
	}
	if call.Name != "POST" || call.Kind != trace.SpanKindClient || call.Service != "inboxworker-e2e" ||
		call.Scope != tracing.ScopeName || call.Failed {
		t.Errorf("the provider request's span: %q, kind %v, service %q, scope %q, failed %v; "+
			"want POST, client, inboxworker-e2e, %s, not failed", call.Name, call.Kind, call.Service, call.Scope,
			call.Failed, tracing.ScopeName)
	}
	checkSpanAttrs(t, *call, map[string]string{
		"http.request.method":       "POST",
		"server.address":            u.Hostname(),
		"server.port":               u.Port(),
		"url.full":                  providerURL,
		"http.response.status_code": "200",
	})
	return *call
}

// checkConsumerSpans checks the spans of the consumer for the test's messages: a consumer span per
// message, child of its producer's span, with the messaging attributes and its outcome; the SMS's
// inbox transactions and provider request as its children; the payments' batch transaction as a
// span linked to their spans, with its inbox transaction as its child; and the dead letter of the
// bad SMS carrying its consumer span's trace context.
func checkConsumerSpans(t *testing.T, spans []tracingtest.Span, call tracingtest.Span, deadLetters []kafka.Message) {
	t.Helper()
	msg := checkMessageSpan(t, spans, smsProducer, topicSMS, 0, map[string]string{
		"inboxworker.idempotency_key": "tr-sms-1",
		"inboxworker.outcome":         "applied",
	})
	if call.TraceID != msg.TraceID || call.ParentSpanID != msg.SpanID {
		t.Errorf("the provider request's span is in trace %s under %s, want a child of the SMS's span %s of trace %s",
			call.TraceID, call.ParentSpanID, msg.SpanID, msg.TraceID)
	}
	if n := len(children(spans, msg, "inbox transaction")); n < 2 {
		t.Errorf("the SMS's span has %d inbox transactions as children, want its claim and its completion", n)
	}

	badMsg := checkMessageSpan(t, spans, badSMSProducer, topicSMS, 1, map[string]string{
		"inboxworker.idempotency_key": "tr-sms-bad",
		"inboxworker.outcome":         "dead_lettered",
		"error.type":                  "invalid_payload",
	})
	if !badMsg.Failed {
		t.Error("the dead-lettered SMS's span is not failed")
	}
	if len(deadLetters) != 1 {
		t.Fatalf("%d dead letters of SMS, want 1", len(deadLetters))
	}
	if got, want := kafkatest.Header(deadLetters[0], "traceparent"), tracingtest.Traceparent(badMsg.TraceID, badMsg.SpanID); got != want {
		t.Errorf("the dead letter's traceparent is %q, want its consumer span's %q", got, want)
	}

	for i, producer := range paymentProducer {
		m := checkMessageSpan(t, spans, producer, topicPayments, int64(i), map[string]string{
			"inboxworker.idempotency_key": fmt.Sprintf("tr-pay-%d", i+1),
			"inboxworker.outcome":         "applied",
		})
		batch := linking(spans, m)
		if batch == nil {
			t.Errorf("no batch span links to the span of payment %d", i+1)
			continue
		}
		if batch.Name != "process "+topicPayments || batch.Kind != trace.SpanKindConsumer ||
			batch.Attributes["messaging.batch.message_count"] == "" {
			t.Errorf("payment %d's batch span: %q, kind %v, attributes %v; want a consumer span with messaging.batch.message_count",
				i+1, batch.Name, batch.Kind, batch.Attributes)
		}
		if n := len(children(spans, *batch, "inbox transaction")); n != 1 {
			t.Errorf("payment %d's batch span has %d inbox transactions as children, want 1", i+1, n)
		}
	}
}

// checkMessageSpan finds the consumer span of the message at offset of topic's partition 0, checks
// that it is the child of producer's span and has the messaging attributes and those of want, and
// returns it.
func checkMessageSpan(t *testing.T, spans []tracingtest.Span, producer producerSpan, topic string, offset int64, want map[string]string) tracingtest.Span {
	t.Helper()
	var found []tracingtest.Span
	for _, s := range spans {
		if s.Name == "process "+topic && s.Attributes["messaging.kafka.offset"] == fmt.Sprint(offset) &&
			s.Attributes["messaging.batch.message_count"] == "" {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans of the message at %s/0/%d, want 1 (all: %v)", len(found), topic, offset, spanNames(spans))
	}
	s := found[0]
	if s.Kind != trace.SpanKindConsumer || s.TraceID != producer.traceID || s.ParentSpanID != producer.spanID {
		t.Errorf("the span of %s/0/%d: kind %v, trace %s, parent %s; want a consumer span, child of %s in trace %s",
			topic, offset, s.Kind, s.TraceID, s.ParentSpanID, producer.spanID, producer.traceID)
	}
	attrs := map[string]string{
		"messaging.system":                   "kafka",
		"messaging.operation.name":           "process",
		"messaging.operation.type":           "process",
		"messaging.consumer.group.name":      "tracing",
		"messaging.destination.name":         topic,
		"messaging.destination.partition.id": "0",
		"messaging.kafka.offset":             fmt.Sprint(offset),
	}
	for k, v := range want {
		attrs[k] = v
	}
	checkSpanAttrs(t, s, attrs)
	if key, ok := s.Attributes["messaging.kafka.message.key"]; ok {
		t.Errorf("the span of %s/0/%d records the Kafka key %q: keys are often personal data", topic, offset, key)
	}
	return s
}

// checkSpanAttrs checks that s has the attributes of want, with their values.
func checkSpanAttrs(t *testing.T, s tracingtest.Span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := s.Attributes[k]; !ok || got != v {
			t.Errorf("span %q: %s = %q (set: %v), want %q", s.Name, k, got, ok, v)
		}
	}
}

// children returns the spans named name whose parent is s.
func children(spans []tracingtest.Span, s tracingtest.Span, name string) []tracingtest.Span {
	var out []tracingtest.Span
	for _, c := range spans {
		if c.Name == name && c.TraceID == s.TraceID && c.ParentSpanID == s.SpanID {
			out = append(out, c)
		}
	}
	return out
}

// linking returns a span that links to s, nil if there is none.
func linking(spans []tracingtest.Span, s tracingtest.Span) *tracingtest.Span {
	for i, b := range spans {
		for _, l := range b.Links {
			if l.TraceID == s.TraceID && l.SpanID == s.SpanID {
				return &spans[i]
			}
		}
	}
	return nil
}

// checkNoPhone checks that no span carries a full phone number, in an attribute or its status.
func checkNoPhone(t *testing.T, spans []tracingtest.Span) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Description}
		for _, v := range s.Attributes {
			texts = append(texts, v)
		}
		for _, text := range texts {
			if strings.Contains(text, "13800138000") {
				t.Errorf("span %q carries a full phone number: %q", s.Name, text)
			}
		}
	}
}

func spanNames(spans []tracingtest.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}
