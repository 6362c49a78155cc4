package outbox_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// proxy forwards TCP connections to a database, and can cut them all and refuse new ones: for a
// relay whose instance loses Postgres, or dies.
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

// cut closes every connection and refuses new ones.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		_ = c.Close()
	}
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
