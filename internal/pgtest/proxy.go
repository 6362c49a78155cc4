package pgtest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to a database, and can cut them all and refuse new ones — a
// database that goes away, as a network failure or an outage makes it: no goodbye from the server,
// just dead sockets — until Restore.
type Proxy struct {
	// URL is the database URL, through the proxy.
	URL    string
	target string
	ln     net.Listener
	wg     sync.WaitGroup
	// refused counts the connections refused while cut: each is one attempt to reach the database.
	refused atomic.Int64

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

// StartProxy starts a Proxy to the database of databaseURL, stopped when tb ends.
func StartProxy(tb testing.TB, databaseURL string) *Proxy {
	tb.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{target: u.Host, ln: ln, conns: make(map[net.Conn]bool)}
	u.Host = ln.Addr().String()
	p.URL = u.String()
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Refused returns how many connections were refused while cut.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

func (p *Proxy) accept() {
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

// track registers c, or closes it if the proxy is cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		_ = c.Close()
		p.refused.Add(1)
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}

func (p *Proxy) forward(client net.Conn) {
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
