package consumer_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestDatabaseOutage cuts the consumer off Postgres for longer than the retry budget: nothing may be
// dead-lettered, and every message is applied once after the database is back.
func TestDatabaseOutage(t *testing.T) {
	t.Parallel()
	forEachMode(t, testDatabaseOutage)
}

func testDatabaseOutage(t *testing.T, mode testMode) {
	// One partition, one key: the messages after "held" wait behind it, so no other transaction is
	// in flight when the connection is cut.
	e := setup(t, mode, 1)
	proxy := startProxy(t, e.db.URL)
	pool, err := pgxpool.New(context.Background(), proxy.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := inbox.NewStore(pool, inbox.Config{Logger: e.log})
	if err != nil {
		t.Fatal(err)
	}
	// The handler of "held" waits, its transaction open, until the connection is cut.
	// Only its first run waits: a rebalance under load may run it again from attempt 1.
	held, release := make(chan struct{}), make(chan struct{})
	var holdOnce sync.Once
	config := testConfig(e.kafka.Addr, pool, store, &recorder{fail: func(d inbox.Delivery) error {
		if d.Key == "held" {
			holdOnce.Do(func() {
				close(held)
				<-release
			})
		}
		return nil
	}}, mode, e.log)
	config.Retry.MaxElapsed = 100 * time.Millisecond
	e.start(config)

	before := keys("before", 10)
	e.produce(before...)
	e.waitFor("the first messages applied", func() bool { return len(e.effects()) == len(before) })

	during := append([]string{"held"}, keys("during", 20)...)
	e.produceOrdered("order-held", during...)
	<-held
	proxy.cut()
	close(release)
	// Long enough for every message's retry budget to run out several times over, were the outage
	// counted against it.
	time.Sleep(10 * config.Retry.MaxElapsed)
	if got := len(e.effects()); got != len(before) {
		t.Fatalf("%d messages applied while the database was unreachable", got-len(before))
	}
	proxy.restore()

	all := append(before, during...)
	e.waitFor("all offsets committed", func() bool { return e.committed() == int64(len(all)) })
	checkOnce(t, e, all)
	if got := testutil.ToFloat64(config.Metrics.Retries.WithLabelValues(topic)); got != 0 {
		t.Errorf("%v retries counted: waiting for the database is no retry of a message", got)
	}
	if got := outcomes(config, "dead_lettered"); got != 0 {
		t.Errorf("%v messages dead-lettered during the outage, want none", got)
	}
	if dead := e.deadLetters(); len(dead) != 0 {
		t.Errorf("%d dead letters, want none", len(dead))
	}
}

// proxy forwards TCP connections to a database, and can cut them all and refuse new ones.
type proxy struct {
	url    string // the database URL, through the proxy
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func startProxy(t *testing.T, databaseURL string) *proxy {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{target: u.Host, ln: ln, conns: make(map[net.Conn]bool)}
	u.Host = ln.Addr().String()
	p.url = u.String()
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// cut closes every connection and refuses new ones until restore.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// track registers c, or closes it if the proxy is down.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		_ = c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}

func (p *proxy) forward(client net.Conn) {
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(server, client)
		_ = server.Close()
		close(done)
	}()
	_, _ = io.Copy(client, server)
	_ = client.Close()
	<-done
}
