package main

// The modes that measure what a stuck message or a dependency's outage costs the rest of the stream:
//
//	overtake         N good callbacks behind one callback per partition that overtakes its order,
//	                 whose orders are created -overtake-delay after the start
//	provider_outage  N SMS events produced at -sms-rate while the SMS provider answers 503 for
//	                 -outage, with RETRY_MAX_ELAPSED = -retry-max-elapsed
//	postgres_outage  N payment callbacks while Postgres is unreachable for -outage, with
//	                 RETRY_MAX_ELAPSED = -retry-max-elapsed
//
// Each produces its own stream and prints its figures; the table's msg/s is the stream over the
// time the mode measures (named in its line).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// The parking modes' settings.
var (
	overtakeDelay = flag.Duration("overtake-delay", 30*time.Second,
		"overtake: how long after the start the overtaking callbacks' orders are created")
	outageFor = flag.Duration("outage", 20*time.Second,
		"provider_outage, postgres_outage: how long the dependency is down")
	outageRetryMaxElapsed = flag.Duration("retry-max-elapsed", 3*time.Second,
		"provider_outage, postgres_outage: the worker's RETRY_MAX_ELAPSED")
	smsRate = flag.Int("sms-rate", 20, "provider_outage: SMS events produced per second")
)

// ownStream are the modes that produce their own stream and create their own orders.
var ownStream = map[string]bool{"overtake": true, "provider_outage": true, "postgres_outage": true}

// The routes' concurrency, as the worker's defaults (PAYMENTS_CONCURRENCY, SMS_CONCURRENCY).
const (
	paymentsConcurrency = 4
	smsConcurrency      = 128
)

func paymentsRoute(e *env, handler inboxworker.Handler) consumer.Route {
	return consumer.Route{Topic: e.topic, Name: "payments", Handler: handler, Concurrency: paymentsConcurrency}
}

// benchWorker is a consumer of the mode's topic with one route, and its metrics.
type benchWorker struct {
	c       *consumer.Consumer
	metrics *consumer.Metrics
	topic   string
	stop    func() error
}

// startWorker runs a consumer of e.topic with handler until stop is called.
func startWorker(ctx context.Context, e *env, pool *pgxpool.Pool, route consumer.Route, retry consumer.Retry) (*benchWorker, error) {
	log := e.cfg.workerLogger()
	store, err := inbox.NewStore(pool, inbox.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	w := &benchWorker{metrics: consumer.NewMetrics(prometheus.NewRegistry()), topic: e.topic}
	w.c, err = consumer.New(consumer.Config{
		Brokers:     []string{e.addr},
		GroupID:     "bench-" + e.topic,
		Routes:      []consumer.Route{route},
		Retry:       retry,
		BatchSize:   e.cfg.BatchSize,
		BatchWait:   e.cfg.BatchWait,
		Store:       store,
		DeadLetters: deadletter.NewStore(pool),
		Metrics:     w.metrics,
		Logger:      log,
	})
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- w.c.Run(runCtx) }()
	w.stop = func() error {
		cancel()
		return <-stopped
	}
	return w, nil
}

// count returns the consumer's count of messages finished with outcome.
func (w *benchWorker) count(outcome string) int {
	var m dto.Metric
	if err := w.metrics.Messages.WithLabelValues(w.topic, outcome).Write(&m); err != nil {
		return -1
	}
	return int(m.GetCounter().GetValue())
}

// waitUntil polls cond every 20ms until it is true, ctx is done, or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writer returns a producer to topic, partitioning by key as producers of the worker's topics do.
func writer(addr, topic string) (*kafka.Writer, func()) {
	transport := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Transport: transport, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	return w, func() {
		_ = w.Close()
		transport.CloseIdleConnections()
	}
}

// lateOrders returns an order number per partition whose key the Hash balancer puts there.
func lateOrders(partitions int) []string {
	ids := make([]int, partitions)
	for i := range ids {
		ids[i] = i
	}
	out := make([]string, partitions)
	found := 0
	for i := 0; found < partitions; i++ {
		no := fmt.Sprintf("LATE-%04d", i)
		p := (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(no)}, ids...)
		if out[p] == "" {
			out[p] = no
			found++
		}
	}
	return out
}

func lateCallback(order, result string, n int) kafka.Message {
	c := callback{
		EventID: fmt.Sprintf("late-%s-%d", order, n), OrderNo: order, Provider: "alipay",
		ProviderTxnID: fmt.Sprintf("TXN-%s-%d", order, n), Amount: "99.90", Currency: "CNY", Result: result, PaidAt: paidAt,
	}
	value, _ := json.Marshal(c)
	return kafka.Message{Key: []byte(order), Value: value,
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(c.EventID)}}}
}

// runOvertake measures N good callbacks behind one callback per partition that overtakes its order:
// a FAILED callback first in each partition, a SUCCESS for the same order among the good ones, and
// the orders created -overtake-delay after the start. The clock stops when the good callbacks are
// all applied; the overtaking ones must then be applied once their orders exist, each order's in
// order.
func runOvertake(ctx context.Context, e *env) (result, error) {
	s := newStream(e.cfg.N, 0)
	if err := s.createOrders(ctx, e.pool); err != nil {
		return result{}, err
	}
	late := lateOrders(e.cfg.Partitions)
	w, closeWriter := writer(e.addr, e.topic)
	defer closeWriter()
	if err := writeOvertaking(ctx, w, s, late); err != nil {
		return result{}, err
	}

	handler, err := payment.NewHandler(payment.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	bw, err := startWorker(ctx, e, e.pool, paymentsRoute(e, handler), consumer.Retry{})
	if err != nil {
		return result{}, err
	}
	defer func() { _ = bw.stop() }()
	created := createLateOrders(ctx, e, start, late)

	if err := waitUntil(ctx, time.Hour, "the good callbacks applied", func() (bool, error) {
		n, err := appliedKeys(ctx, e, "evt-")
		return n == s.unique, err
	}); err != nil {
		return result{}, err
	}
	good := time.Since(start)
	lateNow, err := appliedKeys(ctx, e, "late-")
	if err != nil {
		return result{}, err
	}
	ordersAt := <-created
	if ordersAt.err != nil {
		return result{}, fmt.Errorf("create the late orders: %w", ordersAt.err)
	}
	if err := waitUntil(ctx, 10*time.Minute, "the overtaking callbacks applied", func() (bool, error) {
		n, err := appliedKeys(ctx, e, "late-")
		return n == 2*len(late), err
	}); err != nil {
		return result{}, err
	}
	lateDone := time.Since(start)

	inOrder, paid, err := lateOrdersSettled(ctx, e, late)
	if err != nil {
		return result{}, err
	}
	dead := bw.count("dead_lettered")
	note := fmt.Sprintf("overtake: %d good callbacks applied in %s; %d of the %d overtaking callbacks applied by then; "+
		"their orders created at %s; all applied at %s, %d of %d orders' callbacks in order, %d paid; %d dead letters",
		s.unique, good.Round(time.Millisecond), lateNow, 2*len(late), ordersAt.at.Round(time.Millisecond),
		lateDone.Round(time.Millisecond), inOrder, len(late), paid, dead)
	if dead != 0 || paid != len(late) || inOrder != len(late) {
		return result{}, fmt.Errorf("overtake: %d dead letters, %d of %d late orders paid, %d in order",
			dead, paid, len(late), inOrder)
	}
	return result{Elapsed: good, Messages: s.unique, Note: note}, nil
}

// writeOvertaking writes the overtake mode's stream to w: first a FAILED callback for each of the
// late orders, then the good callbacks of s with a SUCCESS for each late order halfway through.
func writeOvertaking(ctx context.Context, w *kafka.Writer, s stream, late []string) error {
	var first []kafka.Message
	for _, o := range late {
		first = append(first, lateCallback(o, "FAILED", 1))
	}
	if err := w.WriteMessages(ctx, first...); err != nil {
		return err
	}
	var rest []kafka.Message
	for j := range s.n {
		rest = append(rest, s.message(j))
		if j == s.n/2 {
			for _, o := range late {
				rest = append(rest, lateCallback(o, "SUCCESS", 2))
			}
		}
	}
	return w.WriteMessages(ctx, rest...)
}

// ordersCreated is when the late orders were created, counted from the start, or why they were not.
type ordersCreated struct {
	at  time.Duration
	err error
}

// createLateOrders creates the late orders in the background, -overtake-delay after start, and
// sends on the channel it returns when that is done, or ctx ends first.
func createLateOrders(ctx context.Context, e *env, start time.Time, late []string) <-chan ordersCreated {
	created := make(chan ordersCreated, 1)
	go func() {
		select {
		case <-time.After(*overtakeDelay - time.Since(start)):
		case <-ctx.Done():
			created <- ordersCreated{err: ctx.Err()}
			return
		}
		_, err := e.pool.Exec(ctx, `INSERT INTO orders (order_no, user_id, amount, currency)
			SELECT unnest($1::text[]), 'user-late', 99.90, 'CNY'`, late)
		created <- ordersCreated{at: time.Since(start), err: err}
	}()
	return created
}

// appliedKeys returns how many inbox rows have an idempotency key starting with prefix.
func appliedKeys(ctx context.Context, e *env, prefix string) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox WHERE idempotency_key LIKE $1 || '%'`, prefix).Scan(&n)
	return n, err
}

// lateOrdersSettled returns how many of the late orders had their two callbacks applied in order,
// and how many are paid.
func lateOrdersSettled(ctx context.Context, e *env, late []string) (inOrder, paid int, err error) {
	err = e.pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE a.processed_at < b.processed_at), count(*) FILTER (WHERE o.status = 'PAID')
		FROM orders o
		JOIN inbox a ON a.idempotency_key = 'late-' || o.order_no || '-1'
		JOIN inbox b ON b.idempotency_key = 'late-' || o.order_no || '-2'
		WHERE o.order_no = ANY ($1)`, late).Scan(&inOrder, &paid)
	return inOrder, paid, err
}

// outageProvider is an SMS provider fake that answers 503 while it is down and honours Idempotency-Key.
type outageProvider struct {
	srv       *http.Server
	url       string
	downUntil atomic.Int64 // Unix nanoseconds

	mu             sync.Mutex
	callsWhileDown int
	calls          int
	accepted       map[string]bool
	byPhone        map[string][]int // the sequence numbers of each phone's messages, as first accepted
}

func startOutageProvider() (*outageProvider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &outageProvider{url: "http://" + ln.Addr().String() + "/sms", accepted: map[string]bool{}, byPhone: map[string][]int{}}
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *outageProvider) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		To        string `json:"to"`
		Reference string `json:"reference"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.calls++
	if time.Now().UnixNano() < p.downUntil.Load() {
		p.callsWhileDown++
		p.mu.Unlock()
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	if !p.accepted[key] {
		p.accepted[key] = true
		var seq int
		_, _ = fmt.Sscanf(key, "sms-%d", &seq)
		p.byPhone[body.To] = append(p.byPhone[body.To], seq)
	}
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"msg-%s"}`, key)
}

// runProviderOutage produces N SMS events at -sms-rate, to N/4 phones, while the provider is down
// for -outage from the start. The clock stops when every event is delivered or dead-lettered.
func runProviderOutage(ctx context.Context, e *env) (result, error) {
	prov, err := startOutageProvider()
	if err != nil {
		return result{}, err
	}
	defer prov.srv.Close()
	sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: prov.url, Timeout: 2 * time.Second})
	if err != nil {
		return result{}, err
	}
	handler, err := notify.NewHandler(notify.Config{Sender: sender, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	retry := consumer.Retry{MaxElapsed: *outageRetryMaxElapsed}
	bw, err := startWorker(ctx, e, e.pool, consumer.Route{Topic: e.topic, Name: "sms", Call: handler,
		Concurrency: smsConcurrency}, retry)
	if err != nil {
		return result{}, err
	}
	defer func() { _ = bw.stop() }()
	if err := waitUntil(ctx, time.Minute, "the consumer joined its group", func() (bool, error) { return bw.c.Ready(), nil }); err != nil {
		return result{}, err
	}

	n, phones := e.cfg.N, max(1, e.cfg.N/4)
	start := time.Now()
	prov.downUntil.Store(start.Add(*outageFor).UnixNano())
	w, closeWriter := writer(e.addr, e.topic)
	defer closeWriter()
	interval := time.Second / time.Duration(max(1, *smsRate))
	for j := range n {
		phone := fmt.Sprintf("+86138%08d", j%phones)
		key := fmt.Sprintf("sms-%06d", j)
		value := fmt.Sprintf(`{"event_id":%q,"phone":%q,"template":"verify_code","params":{"code":"%06d"}}`, key, phone, j)
		if err := w.WriteMessages(ctx, kafka.Message{Key: []byte(phone), Value: []byte(value),
			Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(key)}}}); err != nil {
			return result{}, err
		}
		if wait := time.Until(start.Add(time.Duration(j+1) * interval)); wait > 0 {
			time.Sleep(wait)
		}
	}
	if err := waitUntil(ctx, 30*time.Minute, "every event delivered or dead-lettered", func() (bool, error) {
		prov.mu.Lock()
		delivered := len(prov.accepted)
		prov.mu.Unlock()
		return delivered+bw.count("dead_lettered") >= n, nil
	}); err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)

	prov.mu.Lock()
	defer prov.mu.Unlock()
	outOfOrder := 0
	for _, seqs := range prov.byPhone {
		if !slices.IsSorted(seqs) {
			outOfOrder++
		}
	}
	dead := bw.count("dead_lettered")
	note := fmt.Sprintf("provider_outage: %d events at %d/s, provider down %s, RETRY_MAX_ELAPSED %s: %d provider calls "+
		"while it was down, %d in all; %d delivered, %d dead letters, %d of %d phones out of order; all settled after %s",
		n, *smsRate, *outageFor, *outageRetryMaxElapsed, prov.callsWhileDown, prov.calls, len(prov.accepted), dead,
		outOfOrder, phones, elapsed.Round(time.Millisecond))
	return result{Elapsed: elapsed, Messages: n, Note: note}, nil
}

// pgProxy forwards TCP connections to Postgres until it is cut: then it closes every connection and
// refuses new ones, as a network partition or a restarting server would.
type pgProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]bool
}

func startPGProxy(target string) (*pgProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pgProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.accept()
	return p, nil
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = true
		p.mu.Unlock()
		go p.pipe(c)
	}
}

func (p *pgProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[up] = true
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

func (p *pgProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}

// proxiedPool starts a pgProxy to the database of -database-url and returns it with a pool of
// e.pool's settings that connects through it, giving up on a connection after 2s.
func proxiedPool(ctx context.Context, e *env) (*pgProxy, *pgxpool.Pool, error) {
	u, err := url.Parse(e.cfg.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	proxy, err := startPGProxy(u.Host)
	if err != nil {
		return nil, nil, err
	}
	proxied := e.pool.Config().Copy()
	proxied.ConnConfig.Host, proxied.ConnConfig.Port = "127.0.0.1", uint16(proxy.ln.Addr().(*net.TCPAddr).Port)
	proxied.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(ctx, proxied)
	if err != nil {
		proxy.ln.Close()
		return nil, nil, err
	}
	return proxy, pool, nil
}

// runPostgresOutage produces N payment callbacks, half before the start and half while Postgres is
// unreachable for -outage from a second after the start. The clock stops when every callback is
// applied or dead-lettered.
func runPostgresOutage(ctx context.Context, e *env) (result, error) {
	s := newStream(e.cfg.N, e.cfg.Redeliveries)
	if err := s.createOrders(ctx, e.pool); err != nil {
		return result{}, err
	}
	proxy, pool, err := proxiedPool(ctx, e)
	if err != nil {
		return result{}, err
	}
	defer proxy.ln.Close()
	defer pool.Close()

	w, closeWriter := writer(e.addr, e.topic)
	defer closeWriter()
	var msgs []kafka.Message
	for j := range s.n {
		msgs = append(msgs, s.message(j))
	}
	half := len(msgs) / 2
	if err := w.WriteMessages(ctx, msgs[:half]...); err != nil {
		return result{}, err
	}
	handler, err := payment.NewHandler(payment.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	bw, err := startWorker(ctx, e, pool, paymentsRoute(e, handler), consumer.Retry{MaxElapsed: *outageRetryMaxElapsed})
	if err != nil {
		return result{}, err
	}
	defer func() { _ = bw.stop() }()
	time.Sleep(time.Second)
	proxy.setCut(true)
	if err := w.WriteMessages(ctx, msgs[half:]...); err != nil {
		return result{}, err
	}
	time.Sleep(*outageFor)
	proxy.setCut(false)
	restored := time.Since(start)

	if err := waitUntil(ctx, 30*time.Minute, "every callback settled", func() (bool, error) {
		return bw.count("applied")+bw.count("dead_lettered") >= s.unique && bw.count("duplicate")+bw.count("applied")+bw.count("dead_lettered") >= s.n, nil
	}); err != nil {
		return result{}, err
	}
	elapsed := time.Since(start)
	var keys int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM inbox`).Scan(&keys); err != nil {
		return result{}, err
	}
	dead := bw.count("dead_lettered")
	note := fmt.Sprintf("postgres_outage: %d callbacks (%d distinct), Postgres unreachable %s from 1s, RETRY_MAX_ELAPSED %s: "+
		"%d applied, %d duplicates, %d dead letters, %d inbox keys; all settled %s after it came back",
		s.n, s.unique, *outageFor, *outageRetryMaxElapsed, bw.count("applied"), bw.count("duplicate"), dead, keys,
		(elapsed - restored).Round(time.Millisecond))
	if dead != 0 || keys != s.unique {
		return result{}, errors.New("postgres_outage: dead letters, or callbacks not applied")
	}
	return result{Elapsed: elapsed, Messages: s.n, Note: note}, nil
}

func init() {
	modes["overtake"] = runOvertake
	modes["provider_outage"] = runProviderOutage
	modes["postgres_outage"] = runPostgresOutage
}
