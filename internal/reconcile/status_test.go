package reconcile_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/reconcile"
)

// TestOddAnswers: what a provider's status endpoint may answer, and what the worker makes of it.
// Nothing but a 200 that is a payment of the order asked about, or PENDING, or a 404, is taken for
// an answer; a redirect is not followed; the token goes in the Authorization header, never in a
// logged error.
func TestOddAnswers(t *testing.T) {
	t.Parallel()
	payment := `{"order_no":"A-1","provider":"alipay","provider_txn_id":"T-1","amount":"9.90","currency":"CNY","result":%q,"paid_at":"2026-12-01T10:00:00Z"}`
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"Paid", 200, fmt.Sprintf(payment, "SUCCESS"), reconcile.ResultPaid},
		{"Failed", 200, fmt.Sprintf(payment, "FAILED"), reconcile.ResultFailed},
		{"Pending", 200, `{"order_no":"A-1","result":"PENDING"}`, reconcile.ResultPending},
		{"Unknown", 404, `no such order`, reconcile.ResultUnknown},
		{"AnotherOrder", 200, strings.Replace(fmt.Sprintf(payment, "SUCCESS"), `"A-1"`, `"B-2"`, 1), reconcile.ResultError},
		{"AmountAsNumber", 200, strings.Replace(fmt.Sprintf(payment, "SUCCESS"), `"9.90"`, `9.9`, 1), reconcile.ResultError},
		{"UnknownResult", 200, fmt.Sprintf(payment, "REFUNDED"), reconcile.ResultError},
		{"NotJSON", 200, `<html>maintenance</html>`, reconcile.ResultError},
		{"Empty", 200, ``, reconcile.ResultError},
		{"Huge", 200, `{"order_no":"A-1","pad":"` + strings.Repeat("x", 70<<10) + `"}`, reconcile.ResultError},
		{"Redirect", 302, ``, reconcile.ResultError},
		{"Unauthorized", 401, `bad token`, reconcile.ResultError},
		{"Throttled", 429, ``, reconcile.ResultError},
		{"Down", 503, ``, reconcile.ResultError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var auth, orderNo, merchant string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				auth, orderNo, merchant = r.Header.Get("Authorization"), r.URL.Query().Get("order_no"), r.URL.Query().Get("m")
				if tc.status == 302 {
					http.Redirect(w, r, "/elsewhere?order_no=A-1", http.StatusFound)
					return
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}))
			defer srv.Close()
			status, err := reconcile.NewStatus(srv.URL+"/status?m=shop-1", "s3cret", 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			a := status.Ask(context.Background(), "A-1")
			if a.Result != tc.want {
				t.Errorf("result %s (%v), want %s", a.Result, a.Err, tc.want)
			}
			if (a.Err != nil) != (tc.want == reconcile.ResultError) || a.Err != nil && strings.Contains(a.Err.Error(), "s3cret") {
				t.Errorf("error %v", a.Err)
			}
			if auth != "Bearer s3cret" || orderNo != "A-1" || merchant != "shop-1" {
				t.Errorf("asked with Authorization %q, order_no %q, m %q", auth, orderNo, merchant)
			}
		})
	}
	if _, err := reconcile.NewStatus("ftp://psp/status", "", time.Second); err == nil {
		t.Error("an ftp:// URL is accepted")
	}
}
