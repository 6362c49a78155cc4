// Package notifytest is a fake SMS provider for tests: an HTTP server that speaks the provider
// contract and honours Idempotency-Key the way a well-behaved provider does.
//
// A Provider delivers each key once: a repeated request with the same key and body gets the first
// answer's message id again and delivers nothing; the same key with a different body is refused with
// 422. It counts the requests of each key, and how many of them it answers at the same time; hooks let a test delay or fail requests (SetHook) or act
// in the moment between accepting a message and answering (SetOnDelivered: kill the worker there to
// test the window between the provider's acceptance and the commit). It is for tests only; it is not
// a provider emulator beyond the contract.
package notifytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"mime"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// Request is one request the provider received.
type Request struct {
	// Key is the Idempotency-Key header.
	Key string
	// Authorization is the Authorization header.
	Authorization string
	// Traceparent is the traceparent header (W3C Trace Context), "" without one.
	Traceparent string
	// The JSON body.
	To        string
	Template  string
	Params    map[string]string
	Reference string
	// Call counts the requests with this key, starting at 1.
	Call int
}

// Reply is what a hook makes of a request.
type Reply struct {
	// Delay holds the request back before anything else happens. The wait ends early when the client
	// goes away or the provider closes; the request then delivers nothing.
	Delay time.Duration
	// Status, when non-zero, answers the request with this status code instead of delivering.
	Status int
	// RetryAfter, when set with Status, is sent as the Retry-After header.
	RetryAfter string
	// Body, when set with Status, is the answer's body.
	Body string
}

// Provider is a fake SMS provider. Use NewProvider; the zero value is not usable.
type Provider struct {
	// URL is the endpoint to post to.
	URL string

	server *httptest.Server
	done   chan struct{}

	mu          sync.Mutex
	token       string
	hook        func(Request) Reply
	onDelivered func(context.Context, Request)
	keys        map[string]*keyState
	inFlight    int // requests being answered now, all keys
	requests    []Request
	delivered   []Request
}

type keyState struct {
	calls    int
	inFlight int    // requests being answered now
	peak     int    // the most requests answered at the same time
	id       string // set once delivered
	body     []byte // the delivered request's body, to tell a resend from a reused key
}

// NewProvider starts a Provider on a local port. It stops when the test ends.
func NewProvider(tb testing.TB) *Provider {
	tb.Helper()
	p := &Provider{done: make(chan struct{}), keys: map[string]*keyState{}}
	p.server = httptest.NewServer(http.HandlerFunc(p.serve))
	p.URL = p.server.URL
	tb.Cleanup(p.close)
	return p
}

func (p *Provider) close() {
	close(p.done)
	p.server.Close()
}

// RequireToken makes the provider answer 401 to requests without "Authorization: Bearer <token>".
func (p *Provider) RequireToken(token string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.token = token
}

// SetHook installs fn, called for every well-formed request before the provider delivers or
// de-duplicates it. nil removes it.
func (p *Provider) SetHook(fn func(Request) Reply) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hook = fn
}

// SetOnDelivered installs fn, called once a message has been delivered and before the provider
// answers. ctx is done when the client goes away or the provider closes; fn may block on it to hold
// the answer back. It is not called for a resend of a delivered key. nil removes it.
func (p *Provider) SetOnDelivered(fn func(ctx context.Context, r Request)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onDelivered = fn
}

// Calls returns how many well-formed requests carried key, whatever their outcome.
func (p *Provider) Calls(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[key]; k != nil {
		return k.calls
	}
	return 0
}

// MostConcurrent returns the most requests with key that the provider was answering at the same
// time: more than 1 means the key was called again while a call of it was out.
func (p *Provider) MostConcurrent(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[key]; k != nil {
		return k.peak
	}
	return 0
}

// InFlight returns how many well-formed requests the provider is answering now.
func (p *Provider) InFlight() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight
}

// Requests returns every well-formed request received, in order.
func (p *Provider) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.requests)
}

// Delivered returns the messages delivered, once each, in order.
func (p *Provider) Delivered() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.delivered)
}

// MessageID returns the id the provider gave key's message, "" if it delivered none.
func (p *Provider) MessageID(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[key]; k != nil {
		return k.id
	}
	return ""
}

type requestBody struct {
	To        string            `json:"to"`
	Template  string            `json:"template"`
	Params    map[string]string `json:"params"`
	Reference string            `json:"reference"`
}

// serve answers one request to the endpoint: it reads it, counts it under its key, lets the hook
// have its say, then delivers the message, or answers as the key's first delivery did.
func (p *Provider) serve(w http.ResponseWriter, r *http.Request) {
	req, body, ok := p.read(w, r)
	if !ok {
		return
	}
	k, hook := p.count(&req)
	defer p.answered(k)
	if hook != nil && p.intercept(w, r, hook(req)) {
		return
	}
	p.deliver(w, r, k, req, body)
}

// read reads a request and checks it against the contract: a POST of JSON, with the token when one
// is required, an Idempotency-Key, a to and a template, and the key again as reference. It answers a
// request that fails a check itself, and reports false.
func (p *Provider) read(w http.ResponseWriter, r *http.Request) (Request, []byte, bool) {
	if r.Method != http.MethodPost {
		answer(w, http.StatusMethodNotAllowed, map[string]string{"error": "POST only"})
		return Request{}, nil, false
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		answer(w, http.StatusUnsupportedMediaType, map[string]string{"error": "Content-Type must be application/json"})
		return Request{}, nil, false
	}
	p.mu.Lock()
	token := p.token
	p.mu.Unlock()
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		answer(w, http.StatusUnauthorized, map[string]string{"error": "bad or missing token"})
		return Request{}, nil, false
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
		answer(w, http.StatusBadRequest, map[string]string{"error": "unreadable body"})
		return Request{}, nil, false
	}
	var body requestBody
	req := Request{Key: r.Header.Get("Idempotency-Key"), Authorization: r.Header.Get("Authorization"),
		Traceparent: r.Header.Get("traceparent")}
	switch err := json.Unmarshal(buf.Bytes(), &body); {
	case req.Key == "":
		answer(w, http.StatusBadRequest, map[string]string{"error": "Idempotency-Key header required"})
		return Request{}, nil, false
	case err != nil:
		answer(w, http.StatusBadRequest, map[string]string{"error": "body is not the expected JSON"})
		return Request{}, nil, false
	case body.To == "" || body.Template == "":
		answer(w, http.StatusBadRequest, map[string]string{"error": "to and template are required"})
		return Request{}, nil, false
	case body.Reference != req.Key:
		answer(w, http.StatusBadRequest, map[string]string{"error": "reference differs from Idempotency-Key"})
		return Request{}, nil, false
	}
	req.To, req.Template, req.Params, req.Reference = body.To, body.Template, body.Params, body.Reference
	return req, buf.Bytes(), true
}

// count records req, numbering it among its key's calls, and counts it in flight until answered is
// called. It returns the key's state and the hook to call.
func (p *Provider) count(req *Request) (*keyState, func(Request) Reply) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.keys[req.Key]
	if k == nil {
		k = &keyState{}
		p.keys[req.Key] = k
	}
	k.calls++
	k.inFlight++
	k.peak = max(k.peak, k.inFlight)
	p.inFlight++
	req.Call = k.calls
	req.Params = maps.Clone(req.Params)
	p.requests = append(p.requests, *req)
	return k, p.hook
}

// answered counts a request of key k, counted by count, out of flight.
func (p *Provider) answered(k *keyState) {
	p.mu.Lock()
	k.inFlight--
	p.inFlight--
	p.mu.Unlock()
}

// intercept does what a hook's reply says: it waits reply.Delay, then answers with reply.Status
// when one is set. It reports whether that ended the request: the wait was cut short (nothing is
// answered then) or the status answered it.
func (p *Provider) intercept(w http.ResponseWriter, r *http.Request, reply Reply) bool {
	if !p.wait(r.Context(), reply.Delay) {
		return true
	}
	if reply.Status == 0 {
		return false
	}
	if reply.RetryAfter != "" {
		w.Header().Set("Retry-After", reply.RetryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(reply.Status)
	_, _ = w.Write([]byte(reply.Body))
	return true
}

// deliver delivers req, whose key's state is k and whose body is body, the first time its key
// comes: it gives the message an id, calls the onDelivered function, and answers with the id. To a
// resend of the same body it answers the same id again; to the key with another body, 422.
func (p *Provider) deliver(w http.ResponseWriter, r *http.Request, k *keyState, req Request, body []byte) {
	p.mu.Lock()
	switch {
	case k.id != "" && !bytes.Equal(k.body, body):
		p.mu.Unlock()
		answer(w, http.StatusUnprocessableEntity, map[string]string{"error": "idempotency key reused with another request"})
		return
	case k.id != "":
		id := k.id
		p.mu.Unlock()
		answer(w, http.StatusOK, map[string]string{"id": id})
		return
	}
	k.id = fmt.Sprintf("msg-%d", len(p.delivered)+1)
	k.body = bytes.Clone(body)
	p.delivered = append(p.delivered, req)
	id, onDelivered := k.id, p.onDelivered
	p.mu.Unlock()

	if onDelivered != nil {
		ctx, cancel := context.WithCancel(r.Context())
		go func() {
			select {
			case <-p.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		onDelivered(ctx, req)
		cancel()
	}
	answer(w, http.StatusOK, map[string]string{"id": id})
}

// wait sleeps for d; it reports false if the client went away or the provider closed first.
func (p *Provider) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-p.done:
		return false
	}
}

func answer(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
