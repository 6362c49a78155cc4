package notifytest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/inboxworker/inboxworker/internal/notify/notifytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// post sends an SMS request for key to p and returns the status and the answer's id.
func post(t *testing.T, ctx context.Context, p *notifytest.Provider, key, token, to string) (int, string, error) {
	t.Helper()
	body := `{"to":"` + to + `","template":"verify_code","params":{"code":"1"},"reference":"` + key + `"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var answer struct{ ID string }
	_ = json.Unmarshal(b, &answer)
	return resp.StatusCode, answer.ID, nil
}

func TestProviderDeduplicatesByKey(t *testing.T) {
	t.Parallel()
	p := notifytest.NewProvider(t)
	ctx := context.Background()
	var ids []string
	for _, key := range []string{"a", "a", "b", "a"} {
		status, id, err := post(t, ctx, p, key, "", "+8613800138000")
		if err != nil || status != http.StatusOK || id == "" {
			t.Fatalf("key %s: %d %q %v, want 200 with an id", key, status, id, err)
		}
		ids = append(ids, id)
	}
	if ids[0] != ids[1] || ids[0] != ids[3] || ids[0] == ids[2] {
		t.Fatalf("ids %q, want one id per key", ids)
	}
	if p.Calls("a") != 3 || p.Calls("b") != 1 || p.Calls("c") != 0 || len(p.Requests()) != 4 {
		t.Fatalf("calls a=%d b=%d c=%d, %d requests; want 3, 1, 0, 4", p.Calls("a"), p.Calls("b"), p.Calls("c"),
			len(p.Requests()))
	}
	d := p.Delivered()
	if len(d) != 2 || d[0].Key != "a" || d[1].Key != "b" || d[0].To != "+8613800138000" || d[0].Params["code"] != "1" {
		t.Fatalf("delivered %+v, want a then b", d)
	}
	if p.MessageID("a") != ids[0] {
		t.Fatalf("MessageID(a) = %q, want %q", p.MessageID("a"), ids[0])
	}

	// The same key with another request is refused, as providers do.
	if status, _, err := post(t, ctx, p, "a", "", "+14155552671"); err != nil || status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused: %d %v, want 422", status, err)
	}
}

func TestProviderToken(t *testing.T) {
	t.Parallel()
	p := notifytest.NewProvider(t)
	p.RequireToken("tok")
	ctx := context.Background()
	for _, tt := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"other", http.StatusUnauthorized}, {"tok", http.StatusOK}} {
		if status, _, err := post(t, ctx, p, "k-"+tt.token, tt.token, "+8613800138000"); err != nil || status != tt.want {
			t.Fatalf("token %q: %d %v, want %d", tt.token, status, err, tt.want)
		}
	}
	if len(p.Delivered()) != 1 {
		t.Fatalf("delivered %d, want 1", len(p.Delivered()))
	}
}

func TestProviderHook(t *testing.T) {
	t.Parallel()
	p := notifytest.NewProvider(t)
	slowArrived := make(chan struct{}, 1)
	p.SetHook(func(r notifytest.Request) notifytest.Reply {
		switch {
		case r.Key == "slow":
			slowArrived <- struct{}{}
			return notifytest.Reply{Delay: time.Minute}
		case r.Call == 1:
			return notifytest.Reply{Status: http.StatusServiceUnavailable, RetryAfter: "2"}
		}
		return notifytest.Reply{}
	})
	ctx := context.Background()
	if status, _, err := post(t, ctx, p, "k", "", "+8613800138000"); err != nil || status != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d %v, want 503", status, err)
	}
	if status, _, err := post(t, ctx, p, "k", "", "+8613800138000"); err != nil || status != http.StatusOK {
		t.Fatalf("second call: %d %v, want 200", status, err)
	}

	// A client that gives up during a delay delivers nothing.
	slowCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t, slowCtx, p, "slow", "", "+8613800138000")
		errc <- err
	}()
	<-slowArrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("slow call: %v, want canceled", err)
	}
	if p.Calls("k") != 2 || p.Calls("slow") != 1 || len(p.Delivered()) != 1 {
		t.Fatalf("calls k=%d slow=%d, %d delivered; want 2, 1, 1", p.Calls("k"), p.Calls("slow"), len(p.Delivered()))
	}
}

// TestProviderOnDelivered is the shape of a crash test: the message is delivered, the client goes
// away before the answer, and its resend with the same key is answered with the same id.
func TestProviderOnDelivered(t *testing.T) {
	t.Parallel()
	p := notifytest.NewProvider(t)
	delivered := make(chan notifytest.Request, 1)
	p.SetOnDelivered(func(ctx context.Context, r notifytest.Request) {
		delivered <- r
		<-ctx.Done() // hold the answer until the client is gone
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := post(t, ctx, p, "k", "", "+8613800138000")
		errc <- err
	}()
	r := <-delivered
	cancel() // the worker dies after the provider accepted
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("first call: %v, want canceled", err)
	}
	p.SetOnDelivered(nil)
	status, id, err := post(t, context.Background(), p, "k", "", "+8613800138000")
	if err != nil || status != http.StatusOK || id != p.MessageID("k") || r.Key != "k" {
		t.Fatalf("resend: %d %q %v, want 200 with %q", status, id, err, p.MessageID("k"))
	}
	if len(p.Delivered()) != 1 || p.Calls("k") != 2 {
		t.Fatalf("%d delivered, %d calls; want 1 and 2", len(p.Delivered()), p.Calls("k"))
	}
}

func TestProviderRejectsMalformed(t *testing.T) {
	t.Parallel()
	p := notifytest.NewProvider(t)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, tt := range []struct {
		name, method, contentType, key, body string
		want                                 int
	}{
		{"Get", http.MethodGet, "application/json", "k", "", http.StatusMethodNotAllowed},
		{"NotJSON", http.MethodPost, "text/plain", "k", `{}`, http.StatusUnsupportedMediaType},
		{"NoKey", http.MethodPost, "application/json", "", `{"to":"+1","template":"t","reference":""}`, http.StatusBadRequest},
		{"ReferenceDiffers", http.MethodPost, "application/json", "k", `{"to":"+1","template":"t","reference":"x"}`,
			http.StatusBadRequest},
		{"BadBody", http.MethodPost, "application/json", "k", `{"to":`, http.StatusBadRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, p.URL, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", tt.contentType)
			req.Header.Set("Idempotency-Key", tt.key)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.want)
			}
		})
	}
	if len(p.Requests()) != 0 {
		t.Fatalf("malformed requests were counted: %+v", p.Requests())
	}
}
