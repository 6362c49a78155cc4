package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/migrations"
)

type config struct {
	N            int
	Redeliveries float64
	Partitions   int
	DatabaseURL  string
	// PooledURL, when set, is where the payment modes' worker connects instead: a connection
	// pooler in transaction mode in front of DatabaseURL's server (see pooledPool).
	PooledURL string
	Modes     []string
	// The worker's settings, for the worker modes (message and batch).
	BatchSize int
	BatchWait time.Duration
	MaxConns  int32 // of the database pool
	// The sms mode's stream and provider: one event to each of Phones phones, answered after
	// ProviderLatency.
	Phones          int
	ProviderLatency time.Duration
	// SMSRecipientLimit is the worker's SMS_RECIPIENT_LIMIT in the sms mode: each event is to its
	// own phone, so none is over it, and the mode measures what counting costs.
	SMSRecipientLimit string
	// SMSRateLimit is the sms_rate mode's SMS_RATE_LIMIT, for the whole group of Instances workers.
	SMSRateLimit float64
	Instances    int
	// OnePartition puts the sms_rate mode's whole stream on partition 0: all the traffic on one
	// instance of the group.
	OnePartition bool
	// CPUProfile, when set, is where to write a CPU profile of each mode (with the mode as suffix).
	CPUProfile string
	// LogLevel is the level of the worker's log, written as the worker writes it: JSON lines on
	// stderr. At info, a line per applied payment, as the worker logs by default.
	LogLevel slog.Level
	// LogOutcomes is the worker's LOG_OUTCOMES: false logs the line of each applied payment at
	// debug.
	LogOutcomes bool
}

// appliedLevel is the level of the payment handler's line per applied callback, as the worker sets it.
func (cfg config) appliedLevel() slog.Level {
	if cfg.LogOutcomes {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// workerLogger is the log of the worker modes: JSON lines on stderr, from cfg.LogLevel up.
func (cfg config) workerLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
}

// result is what one mode measured.
type result struct {
	Mode     string
	Elapsed  time.Duration
	Messages int
	// Latencies samples the time of each message from its fetch to the offset commit that covers
	// it; empty where the mode has no messages to time (copy).
	Latencies *reservoir
	PeakRSS   int64 // bytes
	// Note, when set, is a line of the mode's own to print under the table.
	Note string
}

func (r result) rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// env is what a mode runs against.
type env struct {
	cfg   config
	addr  string        // broker
	topic string        // holds the stream
	pool  *pgxpool.Pool // connects directly: sets the mode up and checks its outcome
	// workerPool is the worker's: pool, or one through -pooled-url.
	workerPool *pgxpool.Pool
	stream     stream
}

type mode func(ctx context.Context, e *env) (result, error)

var modes = map[string]mode{
	"kafka":   runKafka,
	"message": runWorker(consumer.PerMessage),
	"batch":   runWorker(consumer.PerBatch),
	// batch_events is batch with the order events emitted through the outbox and relayed.
	"batch_events": runPayments(consumer.PerBatch, true),
	// batch_hmac and batch_ed25519 are batch with every callback signed, and verified.
	"batch_hmac":    runWorker(consumer.PerBatch),
	"batch_ed25519": runWorker(consumer.PerBatch),
	"copy":          runCopy,
	"sms":           runSMS,
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	for _, m := range cfg.Modes {
		if modes[m] == nil {
			return fmt.Errorf("unknown mode %q", m)
		}
	}
	topics := make([]string, len(cfg.Modes))
	for i, m := range cfg.Modes {
		topics[i] = "bench." + m
	}
	deadLetterTopics := make([]string, 0, len(topics))
	for _, t := range topics {
		deadLetterTopics = append(deadLetterTopics, t+".dlq", t+".events")
	}
	addr, stopBroker, err := startBroker(int32(cfg.Partitions), slices.Concat(topics, deadLetterTopics))
	if err != nil {
		return fmt.Errorf("start broker: %w", err)
	}
	defer stopBroker()

	s := newStream(cfg.N, cfg.Redeliveries)
	if slices.ContainsFunc(cfg.Modes, func(m string) bool { return m != "sms" }) {
		fmt.Fprintf(out, "%d messages (%d callbacks, %d redeliveries), ", cfg.N, s.unique, cfg.N-s.unique)
	}
	fmt.Fprintf(out, "%d partitions, GOMAXPROCS=%d, %s\n", cfg.Partitions, runtime.GOMAXPROCS(0), runtime.Version())
	fmt.Fprintf(out, "worker: batch size %d, batch wait %s, %d database connections\n\n",
		cfg.BatchSize, cfg.BatchWait, cfg.MaxConns)

	var results []result
	for i, m := range cfg.Modes {
		s.signing = modeSigning[m]
		e := &env{cfg: cfg, addr: addr, topic: topics[i], stream: s}
		r, err := runMode(ctx, e, m)
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		results = append(results, r)
		fmt.Fprintf(out, "%-8s done: %8.0f msg/s\n", m, r.rate())
	}
	fmt.Fprintln(out)
	report(out, results)
	return nil
}

// runMode gives the mode a fresh schema holding the stream's orders and a topic holding the stream,
// then runs it with the peak RSS reset.
func runMode(ctx context.Context, e *env, name string) (result, error) {
	schema := "bench_" + name
	admin, err := pgx.Connect(ctx, e.cfg.DatabaseURL)
	if err != nil {
		return result{}, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		return result{}, err
	}
	defer admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")

	poolConfig, err := pgxpool.ParseConfig(e.cfg.DatabaseURL)
	if err != nil {
		return result{}, err
	}
	poolConfig.ConnConfig.RuntimeParams["search_path"] = schema
	poolConfig.MaxConns = e.cfg.MaxConns
	if e.pool, err = pgxpool.NewWithConfig(ctx, poolConfig); err != nil {
		return result{}, err
	}
	defer e.pool.Close()
	if _, err := migrations.Up(ctx, e.pool, nil); err != nil {
		return result{}, err
	}
	if err := e.produceStream(ctx, name); err != nil {
		return result{}, err
	}
	e.workerPool = e.pool
	if e.cfg.PooledURL != "" {
		pool, closePool, err := pooledPool(ctx, admin, e.cfg, schema)
		if err != nil {
			return result{}, fmt.Errorf("through -pooled-url: %w", err)
		}
		defer closePool()
		e.workerPool = pool
	}
	runtime.GC()
	if e.cfg.CPUProfile != "" {
		f, err := os.Create(e.cfg.CPUProfile + "." + name)
		if err != nil {
			return result{}, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return result{}, err
		}
		defer pprof.StopCPUProfile()
	}
	resetPeakRSS()
	r, err := modes[name](ctx, e)
	r.Mode, r.PeakRSS = name, peakRSS()
	return r, err
}

// produceStream produces mode name's stream, and the orders it pays, unless the mode produces its
// own.
func (e *env) produceStream(ctx context.Context, name string) error {
	switch {
	case ownStream[name]:
		return nil
	case name == "sms":
		return produceSMS(ctx, e.cfg, e.addr, e.topic)
	}
	if err := e.stream.createOrders(ctx, e.pool); err != nil {
		return fmt.Errorf("create orders: %w", err)
	}
	return e.stream.produce(ctx, e.addr, e.topic)
}

func report(out io.Writer, results []result) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "mode\tmsg/s\telapsed\tp50\tp99\tpeak RSS\t")
	byMode := map[string]result{}
	for _, r := range results {
		byMode[r.Mode] = r
		p50, p99 := "-", "-"
		if r.Latencies != nil {
			p50 = r.Latencies.quantile(0.50).Round(time.Microsecond).String()
			p99 = r.Latencies.quantile(0.99).Round(time.Microsecond).String()
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%s\t%.1f MiB\t\n", r.Mode, r.rate(),
			r.Elapsed.Round(time.Millisecond), p50, p99, float64(r.PeakRSS)/(1<<20))
	}
	w.Flush()
	fmt.Fprintln(out)
	ratio := func(a, b string) {
		ra, okA := byMode[a]
		rb, okB := byMode[b]
		if okA && okB {
			fmt.Fprintf(out, "%s/%s = %.2f\n", a, b, ra.rate()/rb.rate())
		}
	}
	ratio("batch", "message")
	ratio("batch", "kafka")
	ratio("batch", "copy")
	ratio("batch_events", "batch")
	ratio("batch_hmac", "batch")
	ratio("batch_ed25519", "batch")
	for _, r := range results {
		if r.Note != "" {
			fmt.Fprintln(out, r.Note)
		}
	}
}

// resetPeakRSS resets the kernel's high-water mark of this process's resident set (Linux).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS returns the high-water mark of this process's resident set since the last reset (Linux),
// or 0 where it cannot be read.
func peakRSS() int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// reservoir keeps a uniform sample of a stream of durations in constant memory.
type reservoir struct {
	mu     sync.Mutex
	seen   int
	sample []time.Duration
	rng    *rand.Rand
}

func newReservoir(size int) *reservoir {
	return &reservoir{sample: make([]time.Duration, 0, size), rng: rand.New(rand.NewPCG(1, 2))}
}

func (r *reservoir) add(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen++
	if len(r.sample) < cap(r.sample) {
		r.sample = append(r.sample, d)
	} else if i := r.rng.IntN(r.seen); i < len(r.sample) {
		r.sample[i] = d
	}
}

func (r *reservoir) quantile(q float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sample) == 0 {
		return 0
	}
	s := slices.Clone(r.sample)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// pooledPool opens the worker's pool through cfg.PooledURL, as its user, with that role's
// search_path set to schema until closePool: a pooler in transaction mode refuses search_path as
// a startup parameter, so a team behind one sets the schema on the role. The role must exist, and
// may use schema's tables once the mode has set them up.
func pooledPool(ctx context.Context, admin *pgx.Conn, cfg config, schema string) (
	pool *pgxpool.Pool, closePool func(), err error) {
	poolConfig, err := pgxpool.ParseConfig(cfg.PooledURL)
	if err != nil {
		return nil, nil, err
	}
	role := pgx.Identifier{poolConfig.ConnConfig.User}.Sanitize()
	for _, stmt := range []string{
		"ALTER ROLE " + role + " SET search_path = " + schema,
		"GRANT USAGE, CREATE ON SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return nil, nil, err
		}
	}
	// A session takes its role's settings when it starts: the pooler's server connections of the
	// role, opened before, are ended, and it opens new ones.
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`,
		poolConfig.ConnConfig.User); err != nil {
		return nil, nil, err
	}
	reset := func() { _, _ = admin.Exec(context.WithoutCancel(ctx), "ALTER ROLE "+role+" RESET search_path") }
	poolConfig.MaxConns = cfg.MaxConns
	if pool, err = pgxpool.NewWithConfig(ctx, poolConfig); err != nil {
		reset()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); reset() }, nil
}
