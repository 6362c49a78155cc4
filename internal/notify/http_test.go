package notify_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/notify"
)

const (
	testPhone = "+8613800138000"
	testToken = "s3cr3t-T0KEN"
)

var testSMS = notify.SMS{Key: "evt-1", To: testPhone, Template: "verify_code", Params: map[string]string{"code": "123456"}}

// secrets are what must never appear in an error or a log line: the token and the test number as
// E.164, without its '+' and in national form.
var secrets = []string{testToken, testPhone, testPhone[1:], testPhone[3:]}

func checkNoSecrets(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s holds %q: %s", what, s, text)
		}
	}
}

// newProvider starts a provider answering with handle and returns a sender for it.
func newProvider(t *testing.T, config notify.HTTPConfig, handle http.HandlerFunc) *notify.HTTPSender {
	t.Helper()
	srv := httptest.NewServer(handle)
	t.Cleanup(srv.Close)
	config.URL, config.Client = srv.URL, srv.Client()
	sender, err := notify.NewHTTPSender(config)
	if err != nil {
		t.Fatal(err)
	}
	return sender
}

func TestHTTPSenderRequest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, token, wantAuthorization string
	}{
		{name: "WithToken", token: testToken, wantAuthorization: "Bearer " + testToken},
		{name: "WithoutToken"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan *http.Request, 1)
			var body map[string]any
			sender := newProvider(t, notify.HTTPConfig{Token: tt.token}, func(w http.ResponseWriter, r *http.Request) {
				if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
					t.Errorf("provider: body: %v", err)
				}
				got <- r
				_, _ = io.WriteString(w, `{"id":"m-1","status":"queued"}`)
			})
			id, err := sender.Send(context.Background(), testSMS)
			if err != nil || id != "m-1" {
				t.Fatalf("Send = %q, %v; want m-1", id, err)
			}
			r := <-got
			if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
				t.Errorf("request %s with Content-Type %q, want POST application/json", r.Method,
					r.Header.Get("Content-Type"))
			}
			if k := r.Header.Values("Idempotency-Key"); len(k) != 1 || k[0] != testSMS.Key {
				t.Errorf("Idempotency-Key = %q, want [%q]", k, testSMS.Key)
			}
			if a, ok := r.Header["Authorization"]; tt.wantAuthorization == "" && ok {
				t.Errorf("Authorization = %q, want none", a)
			} else if tt.wantAuthorization != "" && r.Header.Get("Authorization") != tt.wantAuthorization {
				t.Errorf("Authorization = %q, want %q", r.Header.Get("Authorization"), tt.wantAuthorization)
			}
			want := map[string]any{"to": testPhone, "template": "verify_code",
				"params": map[string]any{"code": "123456"}, "reference": testSMS.Key}
			if g, w := mustJSON(t, body), mustJSON(t, want); g != w {
				t.Errorf("body = %s, want %s", g, w)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHTTPSenderAnswers(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 190) + "THE-END-OF-A-LONG-ANSWER" + strings.Repeat("z", 300)
	for _, tt := range []struct {
		name       string
		status     int
		retryAfter string
		body       string

		wantID         string
		wantKind       fault.Kind // when the send fails
		wantReason     inboxtype.Reason
		wantRetryAfter time.Duration
		wantInError    []string
	}{
		{name: "OK", status: 200, body: `{"id":"m-1"}`, wantID: "m-1"},
		{name: "CreatedNumericID", status: 201, body: `{"id":12345}`, wantID: "12345"},
		{name: "AcceptedWithoutID", status: 202, body: ``},
		{name: "OKNotJSON", status: 200, body: `<html>ok</html>`},
		{name: "BadRequest", status: 400, body: `{"error":"unknown template"}`,
			wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected,
			wantInError: []string{"400 Bad Request", `{"error":"unknown template"}`}},
		{name: "BadRequestLongAnswerCut", status: 400, body: long,
			wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected,
			wantInError: []string{"400 Bad Request", strings.Repeat("a", 190) + "THE-END-OF…"}},
		{name: "AnswerEchoesNumberAndToken", status: 422,
			body:     `{"error":"+8613800138000 is blocked","to":"8613800138000","national":"138 0013 8000","auth":"Bearer ` + testToken + `"}`,
			wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected,
			wantInError: []string{"422 Unprocessable Entity", "+86138****8000 is blocked", "[number]", "[token]"}},
		{name: "Unauthorized", status: 401, wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected,
			wantInError: []string{"401 Unauthorized"}},
		{name: "NotFound", status: 404, wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected},
		{name: "Conflict", status: 409, wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected},
		{name: "NotModified", status: 304, wantKind: fault.KindPermanent, wantReason: notify.ProviderRejected},
		{name: "RequestTimeout", status: 408, wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted},
		{name: "TooManyRequestsRetryAfterSeconds", status: 429, retryAfter: "7",
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted, wantRetryAfter: 7 * time.Second,
			wantInError: []string{"429 Too Many Requests"}},
		// A 429 with no Retry-After still asks to slow down: a second's wait.
		{name: "TooManyRequestsNoRetryAfter", status: 429,
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted, wantRetryAfter: time.Second},
		{name: "TooManyRequestsRetryAfterMalformed", status: 429, retryAfter: "soon",
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted, wantRetryAfter: time.Second},
		{name: "InternalServerError", status: 500, body: "boom", wantKind: fault.KindRetryable,
			wantReason: inboxtype.RetriesExhausted, wantInError: []string{"500 Internal Server Error: boom"}},
		{name: "BadGateway", status: 502, wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted},
		{name: "ServiceUnavailableRetryAfterMalformed", status: 503, retryAfter: "soon",
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted},
		{name: "ServiceUnavailableRetryAfterPast", status: 503, retryAfter: "Sun, 06 Nov 1994 08:49:37 GMT",
			wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted},
		{name: "GatewayTimeout", status: 504, wantKind: fault.KindRetryable, wantReason: inboxtype.RetriesExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sender := newProvider(t, notify.HTTPConfig{Token: testToken}, func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			id, err := sender.Send(context.Background(), testSMS)
			if tt.wantReason == "" { // accepted
				if err != nil || id != tt.wantID {
					t.Fatalf("Send = %q, %v; want %q", id, err, tt.wantID)
				}
				return
			}
			if err == nil {
				t.Fatalf("Send = %q, nil; want an error", id)
			}
			kind, reason, retryAfter := fault.Classify(err)
			if kind != tt.wantKind || reason != tt.wantReason || retryAfter != tt.wantRetryAfter {
				t.Errorf("Send error %q classified %v %q %v, want %v %q %v", err, kind, reason, retryAfter,
					tt.wantKind, tt.wantReason, tt.wantRetryAfter)
			}
			for _, s := range tt.wantInError {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if len(err.Error()) > 300 {
				t.Errorf("error is %d bytes long, want the answer cut", len(err.Error()))
			}
			checkNoSecrets(t, "error", err.Error())
		})
	}
}

func TestHTTPSenderRetryAfterDate(t *testing.T) {
	t.Parallel()
	// The provider asks for a retry an hour after its own clock, in whole seconds as HTTP dates are.
	at := time.Now().Add(time.Hour).Truncate(time.Second)
	sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", at.UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	before := time.Now()
	_, err := sender.Send(context.Background(), testSMS)
	after := time.Now()
	// The delay is the date less the sender's clock when it read the answer, some time between
	// before and after: however long the request took, the delay lies between these two bounds.
	kind, _, retryAfter := fault.Classify(err)
	if kind != fault.KindRetryable || retryAfter < at.Sub(after) || retryAfter > at.Sub(before) {
		t.Fatalf("Send error %v classified %v, retry after %v; want retryable after between %v and %v",
			err, kind, retryAfter, at.Sub(after), at.Sub(before))
	}
}

func TestHTTPSenderNoAnswer(t *testing.T) {
	t.Parallel()
	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		sender := newProvider(t, notify.HTTPConfig{Timeout: 50 * time.Millisecond},
			func(w http.ResponseWriter, r *http.Request) {
				// Read the request first: the server notices a client gone only once the body is read.
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-time.After(10 * time.Second):
				}
			})
		_, err := sender.Send(context.Background(), testSMS)
		if kind, _, _ := fault.Classify(err); kind != fault.KindRetryable ||
			!errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 50ms") {
			t.Fatalf("Send error %v classified %v, want a retryable timeout", err, kind)
		}
	})
	t.Run("ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		srv.Close()
		sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: srv.URL + "/sms?api_key=" + testToken})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sender.Send(context.Background(), testSMS)
		if kind, _, _ := fault.Classify(err); kind != fault.KindRetryable || !strings.Contains(err.Error(), "request failed") {
			t.Fatalf("Send error %v classified %v, want a retryable connection error", err, kind)
		}
		checkNoSecrets(t, "error", err.Error())
	})
}

func TestNewHTTPSender(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name      string
		config    notify.HTTPConfig
		wantError string
	}{
		{name: "Valid", config: notify.HTTPConfig{URL: "https://sms.example/send", Token: testToken}},
		{name: "NoURL", wantError: "HTTPConfig.URL is required"},
		{name: "RelativeURL", config: notify.HTTPConfig{URL: "/send"}, wantError: "HTTPConfig.URL must be"},
		{name: "OtherScheme", config: notify.HTTPConfig{URL: "ftp://sms.example"}, wantError: "HTTPConfig.URL must be"},
		{name: "NegativeTimeout", config: notify.HTTPConfig{URL: "http://sms.example", Timeout: -time.Second},
			wantError: "HTTPConfig.Timeout"},
		{name: "TokenWithNewline", config: notify.HTTPConfig{URL: "http://sms.example", Token: testToken + "\nX: y"},
			wantError: "HTTPConfig.Token"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := notify.NewHTTPSender(tt.config)
			if tt.wantError == "" && err != nil || tt.wantError != "" && (err == nil || !strings.Contains(err.Error(), tt.wantError)) {
				t.Fatalf("NewHTTPSender: %v, want %q", err, tt.wantError)
			}
			if err != nil {
				checkNoSecrets(t, "error", err.Error())
			}
		})
	}
}
