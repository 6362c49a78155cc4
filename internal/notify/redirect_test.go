package notify_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// TestHTTPSenderRedirect: a redirect is never followed and never a delivery. Followed, a 301/302/303
// turns the POST into a GET without its body, whose 2xx would record an SMS nobody sent; a 307/308
// posts the message again to wherever the answer points.
func TestHTTPSenderRedirect(t *testing.T) {
	t.Parallel()
	var targetHits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		targetHits.Add(1)
		_, _ = io.WriteString(w, `{"id":"from-the-redirect-target"}`)
	}))
	t.Cleanup(target.Close)
	for _, tt := range []struct {
		name     string
		status   int
		location string
		want     []string
	}{
		{name: "MovedPermanently", status: 301, location: target.URL + "/v2/sms?api_key=" + testToken + "&to=%2B8613800138000",
			want: []string{"301 Moved Permanently", "redirect", target.URL + "/v2/sms?api_key=xxxxx&to=xxxxx"}},
		{name: "Found", status: 302, location: target.URL + "/sms", want: []string{"302 Found", target.URL + "/sms"}},
		{name: "SeeOther", status: 303, location: target.URL + "/sms", want: []string{"303 See Other"}},
		{name: "TemporaryRedirect", status: 307, location: target.URL + "/sms", want: []string{"307 Temporary Redirect"}},
		{name: "PermanentRedirect", status: 308, location: target.URL + "/sms", want: []string{"308 Permanent Redirect"}},
		{name: "RelativeLocation", status: 307, location: "/v2/sms/8613800138000?key=" + testToken,
			want: []string{"/v2/sms/[number]?key=xxxxx"}},
		{name: "NoLocation", status: 302, want: []string{"302 Found", "no Location"}},
		{name: "TokenInLocation", status: 301, location: "/send/" + testToken, want: []string{"/send/[token]"}},
		{name: "UserInfoInLocation", status: 301, location: "https://user:pw-s3cret@sms.example/send",
			want: []string{"https://user:xxxxx@sms.example/send"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var hits atomic.Int32
			sender := newProvider(t, notify.HTTPConfig{Token: testToken}, func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				if tt.location != "" {
					w.Header().Set("Location", tt.location)
				}
				w.WriteHeader(tt.status)
			})
			id, err := sender.Send(context.Background(), testSMS)
			if err == nil {
				t.Fatalf("Send = %q, nil; want provider_rejected", id)
			}
			if kind, reason, _ := fault.Classify(err); kind != fault.KindPermanent || reason != notify.ProviderRejected {
				t.Fatalf("Send error %q classified %v %q, want permanent %q", err, kind, reason, notify.ProviderRejected)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			checkNoSecrets(t, "error", err.Error())
			if strings.Contains(err.Error(), "pw-s3cret") {
				t.Errorf("error %q holds the Location's password", err)
			}
			if n := hits.Load(); n != 1 {
				t.Errorf("provider got %d requests, want 1", n)
			}
		})
	}
	if n := targetHits.Load(); n != 0 {
		t.Fatalf("the redirect target got %d requests, want none", n)
	}
}

// TestHTTPSenderRedirectClientUnchanged: the sender does not change the client it was given.
func TestHTTPSenderRedirectClientUnchanged(t *testing.T) {
	t.Parallel()
	client := &http.Client{}
	if _, err := notify.NewHTTPSender(notify.HTTPConfig{URL: "https://sms.example/send", Client: client}); err != nil {
		t.Fatal(err)
	}
	if client.CheckRedirect != nil {
		t.Fatal("NewHTTPSender set CheckRedirect on the caller's client")
	}
}

// TestHandleRedirectRecordsNothing: through the handler and Postgres, a redirect records no SMS.
func TestHandleRedirectRecordsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"id":"never-sent"}`)
	}))
	t.Cleanup(target.Close)
	sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusMovedPermanently)
	})
	outcome, err := e.process(t, e.newHandler(t, sender), "k1", testEvent, 1)
	if _, reason, _ := fault.Classify(err); reason != notify.ProviderRejected || outcome == inbox.Applied {
		t.Fatalf("Process = %q, %v; want provider_rejected", outcome, err)
	}
	e.checkNothingRecorded(t, "k1")
}
