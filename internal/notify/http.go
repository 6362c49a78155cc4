package notify

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/jsonobject"
	"github.com/inboxworker/inboxworker/internal/tracing"
)

// HTTPConfig configures an HTTPSender.
type HTTPConfig struct {
	// URL is the provider's endpoint, an absolute http or https URL. Required.
	URL string
	// Token, when set, is sent as "Authorization: Bearer <Token>". It never appears in errors or logs.
	Token string
	// Timeout bounds each request, the answer included. Defaults to 5s.
	Timeout time.Duration
	// Client defaults to http.DefaultClient. The sender uses a copy of it that does not follow
	// redirects; the client itself is not changed.
	Client *http.Client
	// Tracer records each request as a client span, child of the span in Send's context, and puts
	// its trace context in the request's traceparent header. Defaults to none: no span, no header.
	Tracer *tracing.Tracer
}

// HTTPSender sends SMS through the HTTP provider contract:
//
//	POST URL
//	Content-Type: application/json
//	Idempotency-Key: <key>
//	Authorization: Bearer <token>     (when a token is set)
//	traceparent: 00-<trace>-<span>-01 (when tracing is on)
//	{"to":"+8613800138000","template":"verify_code","params":{"code":"123456"},"reference":"<key>"}
//
// A 2xx answer is accepted; the "id" of its JSON body (a string, or a number taken as its text) is
// the provider message id, made fit to store (see storableID): once the provider accepted, nothing in
// its answer may make recording the SMS fail, or a replay would send it again. A 2xx without a usable
// id is still accepted, with id "": the provider says the message went out, and retrying would at
// best repeat that answer and at worst deliver twice. The handler records it with no id and logs a
// warning.
//
// A redirect (3xx) is never followed and never a delivery. Go's client would turn a 301, 302 or 303
// into a GET without the body, whose 2xx would record as sent an SMS that nobody sent, and would
// post a 307 or 308 again to wherever the answer points. A provider endpoint that moved is a
// misconfiguration: the answer is permanent, reason ProviderRejected, and the error names the
// redirect's target with its query values and password masked.
//
// 408, 429, 5xx, timeouts and connection errors are retryable, with the answer's Retry-After (seconds
// or an HTTP date) as the error's RetryAfter (inboxworker.RetryableAfter); a 429 without one is
// taken as a Retry-After of 1s, so that it slows the route down too. Any other status is permanent, reason
// ProviderRejected, with the status and the start of the provider's answer in the error text,
// after removing the token and anything that looks like a phone number from it.
type HTTPSender struct {
	url     string
	token   string
	timeout time.Duration
	client  *http.Client
	tracer  *tracing.Tracer
}

// ErrInvalidToken is NewHTTPSender's error for a token that cannot go in an HTTP header. It does
// not quote the token.
var ErrInvalidToken = errors.New("notify: HTTPConfig.Token must be printable ASCII without spaces")

// NewHTTPSender returns an HTTPSender.
func NewHTTPSender(config HTTPConfig) (*HTTPSender, error) {
	u, err := url.Parse(config.URL)
	switch {
	case config.URL == "":
		return nil, errors.New("notify: HTTPConfig.URL is required")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return nil, errors.New("notify: HTTPConfig.URL must be an absolute http or https URL")
	case config.Timeout < 0:
		return nil, fmt.Errorf("notify: HTTPConfig.Timeout must be positive, got %s", config.Timeout)
	case strings.ContainsFunc(config.Token, func(r rune) bool { return r < 0x21 || r > 0x7e }):
		return nil, ErrInvalidToken
	}
	// A copy of the client, so that the caller's (http.DefaultClient by default) keeps following
	// redirects for whatever else uses it.
	client := *cmp.Or(config.Client, http.DefaultClient)
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &HTTPSender{
		url:     config.URL,
		token:   config.Token,
		timeout: cmp.Or(config.Timeout, 5*time.Second),
		client:  &client,
		tracer:  config.Tracer,
	}, nil
}

// tooManyRequestsWait is the Retry-After of a 429 without one.
const tooManyRequestsWait = time.Second

// providerRequest is the body of a request to the provider.
type providerRequest struct {
	To        string            `json:"to"`
	Template  string            `json:"template"`
	Params    map[string]string `json:"params"`
	Reference string            `json:"reference"`
}

// Size limits of what is read from the provider and quoted from it.
const (
	maxAnswerRead  = 64 << 10
	maxAnswerQuote = 200
)

// Send posts sms to the provider. See HTTPSender for what its answers mean.
func (s *HTTPSender) Send(ctx context.Context, sms SMS) (string, error) {
	params := sms.Params
	if params == nil {
		params = map[string]string{}
	}
	body, err := json.Marshal(providerRequest{To: sms.To, Template: sms.Template, Params: params, Reference: sms.Key})
	if err != nil {
		return "", inboxworker.Permanent(inboxworker.HandlerError, fmt.Errorf("sms provider: encode request: %w", err))
	}

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return "", inboxworker.Permanent(inboxworker.HandlerError, errors.New("sms provider: cannot build a request to the URL"))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Idempotency-Key", sms.Key)
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	req, span := s.tracer.StartRequest(req)
	defer span.End()

	resp, err := s.client.Do(req)
	if err != nil {
		err = s.transportError(ctx, err)
		span.Fail(transportErrorType(ctx), err)
		return "", inboxworker.Retryable(err)
	}
	defer resp.Body.Close()
	answer, readErr := io.ReadAll(io.LimitReader(resp.Body, maxAnswerRead))
	span.SetHTTPStatus(resp.StatusCode)

	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		// Accepted, whatever happens to the rest of the answer.
		return messageID(answer), nil
	case code >= 300 && code < 400:
		span.Fail(strconv.Itoa(code), nil) // a redirect is a refusal here
		return "", inboxworker.Permanent(ProviderRejected, fmt.Errorf(
			"sms provider: %s, a redirect to %s: redirects are not followed and never count as sent; "+
				"set the provider URL to the endpoint itself", resp.Status, s.clean(s.redirectTarget(resp))))
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500:
		after := retryAfter(resp.Header.Get("Retry-After"), time.Now())
		if code == http.StatusTooManyRequests && after == 0 {
			// Too many requests, with no word on how long to wait: a short wait all the same, so
			// that the route slows down (a Retry-After throttles it and halves its rate limit).
			after = tooManyRequestsWait
		}
		return "", inboxworker.RetryableAfter(fmt.Errorf("sms provider: %s%s", resp.Status, s.quote(answer, sms.To)), after)
	default:
		if readErr != nil && len(answer) == 0 {
			answer = []byte("(answer unreadable)")
		}
		return "", inboxworker.Permanent(ProviderRejected,
			fmt.Errorf("sms provider: %s%s", resp.Status, s.quote(answer, sms.To)))
	}
}

// transportError describes a request that got no answer without quoting the URL (which may carry
// credentials in its query) and keeps the cause for errors.Is.
func (s *HTTPSender) transportError(ctx context.Context, err error) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("sms provider: no answer within %s: %w", s.timeout, err)
	}
	return fmt.Errorf("sms provider: request failed: %w", err)
}

// transportErrorType is the error.type of a request that got no answer: timeout or connection_error,
// the contract's words for them.
func transportErrorType(ctx context.Context) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return "timeout"
	}
	return "connection_error"
}

// messageID returns the "id" of a provider's JSON answer: a string, or a number as its text; "" when
// there is none, and when there are two that differ. It is made storable with storableID. The member
// is the top-level one named id in any case, as encoding/json matches a name; given twice, which one
// the provider meant is a guess (encoding/json would take the last, other readers the first), and a
// guess is not recorded. The same id twice is one id.
func messageID(answer []byte) string {
	obj, err := jsonobject.Parse(answer)
	if err != nil {
		return ""
	}
	id, found := "", false
	for m := range obj.Members() {
		if !isIDMember(m) {
			continue
		}
		if v := idValue(m.Value); !found {
			id, found = v, true
		} else if v != id {
			return ""
		}
	}
	return id
}

// isIDMember reports whether m is named id, in any case.
func isIDMember(m jsonobject.Member) bool {
	return m.Is("id") || m.Is("ID") || m.Is("Id") || m.Is("iD")
}

// idValue is the id a member's raw value gives: a string, or a number as its text, made storable;
// "" for any other value.
func idValue(raw []byte) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return storableID(s)
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return storableID(n.String())
	}
	return ""
}

// MaxMessageIDLen is the most bytes of a provider message id that are kept.
const MaxMessageIDLen = 255

// storableID makes a provider's message id fit for a Postgres text column and a log line: invalid
// UTF-8 and control characters (NUL above all, which Postgres refuses in text) become U+FFFD, so an
// altered id shows that it was altered and cannot pass for another, genuine id; spaces at the ends go;
// and it is cut to MaxMessageIDLen bytes at a character boundary. "" when nothing is left.
func storableID(id string) string {
	id = strings.ToValidUTF8(id, "\uFFFD")
	id = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, id)
	id = strings.TrimSpace(id)
	if len(id) > MaxMessageIDLen {
		cut := MaxMessageIDLen
		for cut > 0 && !utf8.RuneStart(id[cut]) {
			cut--
		}
		id = id[:cut]
	}
	return id
}

// redirectTarget returns the Location of a redirect, resolved against the request's URL, for error
// text: its password and query values masked, digit runs in its path masked, its fragment dropped.
// The token is removed; the caller cuts it (clean).
func (s *HTTPSender) redirectTarget(resp *http.Response) string {
	location := s.withoutToken(resp.Header.Get("Location"))
	if location == "" {
		return "nowhere (no Location header)"
	}
	u, err := url.Parse(location)
	if err != nil {
		return "an unreadable Location"
	}
	if resp.Request != nil && resp.Request.URL != nil {
		u = resp.Request.URL.ResolveReference(u)
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme + "://")
	}
	if u.User != nil {
		b.WriteString(u.User.Username())
		if _, ok := u.User.Password(); ok {
			b.WriteString(":xxxxx")
		}
		b.WriteString("@")
	}
	b.WriteString(u.Host)
	b.WriteString(MaskNumbers(u.EscapedPath()))
	if q := u.Query(); len(q) > 0 {
		for name := range q {
			q[name] = []string{"xxxxx"}
		}
		b.WriteString("?" + q.Encode())
	}
	return b.String()
}

// maxRetryAfter bounds a provider's Retry-After; the consumer's retry budget bounds it further.
const maxRetryAfter = 24 * time.Hour

// retryAfter parses a Retry-After header, delay-seconds or an HTTP date, into a wait from now, at most
// maxRetryAfter. It returns 0 for an absent, malformed or past value.
func retryAfter(header string, now time.Time) time.Duration {
	header = strings.TrimSpace(header)
	if header == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(header, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		return min(time.Duration(min(secs, int64(maxRetryAfter/time.Second)))*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(header); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}

// quote returns ": " and the start of a provider's answer, fit for error text: the token and every
// run of digits long enough to be a phone number (MaskNumbers; the provider may echo the recipient,
// in any form) removed, control characters replaced, and cut to maxAnswerQuote bytes. Empty for an
// empty answer.
func (s *HTTPSender) quote(answer []byte, to string) string {
	text := maskNumbersFor(s.withoutToken(strings.ToValidUTF8(string(answer), "\uFFFD")), to)
	text = s.clean(text)
	if text == "" {
		return ""
	}
	return ": " + text
}

// withoutToken returns text with the token replaced by "[token]". It runs before anything else
// rewrites the text, which could break the token up and leave parts of it.
func (s *HTTPSender) withoutToken(text string) string {
	if s.token == "" {
		return text
	}
	return strings.ReplaceAll(text, s.token, "[token]")
}

// clean makes text from the provider fit for error text: control characters replaced, and cut to
// maxAnswerQuote bytes.
func (s *HTTPSender) clean(text string) string {
	text = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, text)
	text = strings.TrimSpace(text)
	if len(text) > maxAnswerQuote {
		cut := maxAnswerQuote
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "…"
	}
	return text
}
