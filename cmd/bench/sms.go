package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// smsEvent returns SMS event i of the sms mode's stream: one per phone, keyed by its phone as
// producers do.
func smsEvent(i int) kafka.Message {
	phone := fmt.Sprintf("+86138%08d", i)
	value, _ := json.Marshal(map[string]any{"event_id": fmt.Sprintf("sms-%08d", i), "phone": phone,
		"template": "verify_code", "params": map[string]string{"code": fmt.Sprintf("%06d", i%1_000_000)}})
	return kafka.Message{Key: []byte(phone), Value: value}
}

// produceSMS writes the sms mode's stream, cfg.Phones events, to topic.
func produceSMS(ctx context.Context, cfg config, addr, topic string) error {
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Transport: transport, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	if cfg.OnePartition {
		w.Balancer = kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 })
	}
	defer w.Close()
	msgs := make([]kafka.Message, cfg.Phones)
	for i := range msgs {
		msgs[i] = smsEvent(i)
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("produce to %s: %w", topic, err)
	}
	return nil
}

// runSMS is the sms mode: the worker's consumer with the SMS handler over cfg.Phones events, each to
// its own phone, sent to a provider that answers after cfg.ProviderLatency. A partition has at most
// one message in flight, so partitions ÷ latency bounds the rate; the mode reports the rate against
// that bound and checks that every message made exactly one provider call and one notifications row.
func runSMS(ctx context.Context, e *env) (result, error) {
	ends, err := endOffsets(ctx, e.addr, e.topic, e.cfg.Partitions)
	if err != nil {
		return result{}, err
	}
	provider, err := startProvider(e.cfg.ProviderLatency)
	if err != nil {
		return result{}, err
	}
	defer provider.close()
	log := e.cfg.workerLogger()
	store, err := inbox.NewStore(e.pool, inbox.Config{Logger: log})
	if err != nil {
		return result{}, err
	}
	transport := &http.Transport{MaxIdleConnsPerHost: 256}
	defer transport.CloseIdleConnections()
	handler, err := smsHandler(e.cfg, provider.url, &http.Client{Transport: transport}, log)
	if err != nil {
		return result{}, err
	}
	metrics := consumer.NewMetrics(prometheus.NewRegistry())
	progress := newProgress(e.topic, ends)
	c, err := consumer.New(consumer.Config{
		Brokers: []string{e.addr},
		GroupID: "bench-sms",
		// 128 sends at once: the worker's SMS_CONCURRENCY default.
		Routes:      []consumer.Route{{Topic: e.topic, Name: "sms", Call: handler, Concurrency: 128}},
		BatchSize:   e.cfg.BatchSize,
		BatchWait:   e.cfg.BatchWait,
		DeadLetters: deadletter.NewStore(e.pool),
		Store:       store,
		Metrics:     metrics,
		Logger:      log,
		Observer:    progress,
	})
	if err != nil {
		return result{}, err
	}

	elapsed, err := consumeAll(ctx, c, progress)
	if err != nil {
		return result{}, err
	}

	if err := checkSMSSent(ctx, e, provider); err != nil {
		return result{}, err
	}
	r := result{Elapsed: elapsed, Messages: e.cfg.Phones, Latencies: progress.latencies}
	bound := float64(e.cfg.Partitions) / e.cfg.ProviderLatency.Seconds()
	r.Note = fmt.Sprintf("sms: provider latency %s, %d phones: %.0f msg/s = %.2f × the one-per-partition bound "+
		"(%d partitions ÷ %s = %.0f msg/s); at most %d provider calls at once; one call per message",
		e.cfg.ProviderLatency, e.cfg.Phones, r.rate(), r.rate()/bound, e.cfg.Partitions, e.cfg.ProviderLatency,
		bound, provider.mostConcurrent())
	return r, nil
}

// smsHandler returns the SMS handler of the sms mode: the worker's, sending to url through client,
// with the recipient limits of -sms-recipient-limit.
func smsHandler(cfg config, url string, client *http.Client, log *slog.Logger) (*notify.Handler, error) {
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: url, Client: client})
	if err != nil {
		return nil, err
	}
	limits, err := notify.ParseRecipientLimits(cfg.SMSRecipientLimit)
	if err != nil {
		return nil, fmt.Errorf("-sms-recipient-limit: %w", err)
	}
	return notify.NewHandler(notify.Config{Sender: sender, RecipientLimits: limits, Logger: log})
}

// checkSMSSent checks that each of the cfg.Phones messages made exactly one call to provider and
// left one notifications row, sent.
func checkSMSSent(ctx context.Context, e *env, provider *provider) error {
	if err := provider.check(e.cfg.Phones); err != nil {
		return err
	}
	var sent int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM notifications WHERE status = 'SENT'`).Scan(&sent); err != nil {
		return err
	}
	if sent != e.cfg.Phones {
		return fmt.Errorf("%d notifications recorded, want %d", sent, e.cfg.Phones)
	}
	return nil
}

// provider is the sms mode's SMS provider: it answers every request after its latency with a
// message id, and counts the requests of each key and how many it answers at once.
type provider struct {
	url     string
	server  *http.Server
	latency time.Duration

	mu       sync.Mutex
	calls    map[string]int
	inFlight int
	peak     int
}

func startProvider(latency time.Duration) (*provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &provider{url: "http://" + ln.Addr().String(), latency: latency, calls: map[string]int{}}
	p.server = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.server.Serve(ln) }()
	return p, nil
}

func (p *provider) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls[key]++
	p.inFlight++
	p.peak = max(p.peak, p.inFlight)
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	select {
	case <-time.After(p.latency):
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"id": "msg-" + key})
}

// check fails unless the provider received exactly one request for each of the n keys.
func (p *provider) check(n int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for i := range n {
		key := fmt.Sprintf("sms-%08d", i)
		if c := p.calls[key]; c != 1 {
			errs = append(errs, fmt.Errorf("key %s: %d provider calls, want 1", key, c))
		}
	}
	if len(p.calls) != n {
		errs = append(errs, fmt.Errorf("the provider was called for %d keys, want %d", len(p.calls), n))
	}
	return errors.Join(errs...)
}

// mostConcurrent returns the most requests the provider answered at the same time.
func (p *provider) mostConcurrent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.peak
}

func (p *provider) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.server.Shutdown(ctx)
}
