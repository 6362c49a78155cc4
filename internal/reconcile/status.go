package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/inboxworker/inboxworker/internal/payment"
)

// The results of a question about an order: the reconciliations_total metric's values.
const (
	ResultPaid    = "paid"    // the provider says it was paid: applied as its SUCCESS callback
	ResultFailed  = "failed"  // its payment failed: applied as its FAILED callback
	ResultPending = "pending" // the provider's payment is still under way: ask again later
	ResultUnknown = "unknown" // 404: the provider knows no payment for the order: ask again later
	ResultError   = "error"   // no usable answer: the request, or what came back, failed
)

// results are the results, in the metric's order.
var results = []string{ResultPaid, ResultFailed, ResultPending, ResultUnknown, ResultError}

// Answer is what the provider said about an order.
type Answer struct {
	Result string
	// Callback is the payment the answer reports (paid, failed), as its callback would carry it.
	Callback payment.Callback
	// Err says why there is no usable answer (error).
	Err error
}

// maxAnswer bounds an answer's body: a payment's fields fit many times over.
const maxAnswer = 64 << 10

// Status asks the provider's status endpoint: GET URL?order_no=…, with the token as
// Authorization: Bearer. It is safe for concurrent use.
type Status struct {
	url    *url.URL
	token  string
	client *http.Client
}

// NewStatus returns the status endpoint at rawURL (http or https), asked with token ("" for none),
// each request bounded by timeout. Redirects are not followed.
func NewStatus(rawURL, token string, timeout time.Duration) (*Status, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("want an absolute http:// or https:// URL")
	}
	return &Status{url: u, token: token, client: &http.Client{Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// Ask asks about orderNo. A 200 holds the callback's fields and a result SUCCESS, FAILED or
// PENDING, about that order; a 404 means the provider knows no payment for it; anything else is an
// error, as is a 200 that is not such an answer (it is never applied).
func (s *Status) Ask(ctx context.Context, orderNo string) Answer {
	u := *s.url
	q := u.Query()
	q.Set("order_no", orderNo)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Answer{Result: ResultError, Err: err}
	}
	req.Header.Set("Accept", "application/json")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL may hold a secret; the error is logged
		}
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: %w", err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: read the answer: %w", err)}
	case resp.StatusCode == http.StatusNotFound:
		return Answer{Result: ResultUnknown}
	case resp.StatusCode != http.StatusOK:
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: answered %s", resp.Status)}
	case len(body) > maxAnswer:
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: an answer over %d bytes", maxAnswer)}
	}
	return read(orderNo, body)
}

// read reads a 200's body about orderNo.
func read(orderNo string, body []byte) Answer {
	var head struct {
		Result string `json:"result"`
	}
	if json.Unmarshal(body, &head) == nil && head.Result == "PENDING" {
		return Answer{Result: ResultPending}
	}
	cb, err := payment.Decode(body)
	switch {
	case err != nil:
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: the answer: %w", err)}
	case cb.OrderNo != orderNo:
		return Answer{Result: ResultError, Err: fmt.Errorf("payment status: asked about order %q, the answer is about %q",
			orderNo, cb.OrderNo)}
	case cb.Result == payment.Success:
		return Answer{Result: ResultPaid, Callback: cb}
	}
	return Answer{Result: ResultFailed, Callback: cb}
}
