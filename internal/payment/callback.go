package payment

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/jsonobject"
	"github.com/inboxworker/inboxworker/internal/rfc3339"
)

// Result is what the provider says happened to a payment.
type Result string

// The results of the contract.
const (
	Success Result = "SUCCESS"
	Failed  Result = "FAILED"
)

// Callback is a decoded, validated payment callback.
type Callback struct {
	// EventID is the producer's event id; empty when the body has none (the idempotency key then
	// comes from a header). The handler does not use it: the consumer has already chosen the key.
	EventID string
	OrderNo string
	// Provider names the payment provider; with ProviderTxnID it identifies one provider transaction.
	Provider      string
	ProviderTxnID string
	// Amount is a non-negative decimal with exactly two places ("99.90"), as numeric(12,2) stores it.
	Amount   string
	Currency string
	Result   Result
	// PaidAt is the provider's timestamp of the callback.
	PaidAt time.Time
}

// maxTextLen bounds every string field, in characters (the contract's bound on idempotency keys).
const maxTextLen = 255

// FieldError says which field of a callback is malformed, and how. Decode returns it wrapped in a
// permanent fault with reason invalid_payload.
type FieldError struct {
	// Field is the JSON field name, or "payload" when the value as a whole is not a JSON object.
	Field   string
	Problem string
}

func (e *FieldError) Error() string {
	return "payment callback: " + e.Field + ": " + e.Problem
}

func invalid(field, format string, args ...any) error {
	return inboxworker.Permanent(inboxworker.InvalidPayload, &FieldError{Field: field, Problem: fmt.Sprintf(format, args...)})
}

// Decode parses and validates a payment callback. The value must be one JSON object (UTF-8) whose
// fields are JSON strings: order_no, provider, provider_txn_id, amount (a decimal string with at most
// two places: a JSON number is refused, since a float cannot carry money), currency (three upper-case
// letters, ISO 4217), result (SUCCESS or FAILED) and paid_at (RFC 3339) are required; event_id is
// optional; field names are case-sensitive and unknown fields are ignored. A JSON null counts as
// absent. Any violation is a permanent fault with reason invalid_payload wrapping a *FieldError.
func Decode(value []byte) (Callback, error) {
	if !utf8.Valid(value) {
		return Callback{}, invalid("payload", "not valid UTF-8")
	}
	obj, err := jsonobject.Parse(value)
	if err != nil {
		return Callback{}, invalid("payload", "%v", err)
	}
	f, err := readFields(obj).texts()
	if err != nil {
		return Callback{}, err
	}
	return f.callback()
}

// rawFields holds the raw JSON value of each field of a callback, nil for a field the object lacks.
type rawFields struct {
	eventID, orderNo, provider, providerTxnID, amount, currency, result, paidAt []byte
}

// readFields picks the fields of a callback out of obj's members. Of a name given twice, the last
// member counts, as when the object is read into a map.
func readFields(obj jsonobject.Object) rawFields {
	var r rawFields
	for m := range obj.Members() {
		switch {
		case m.Is("event_id"):
			r.eventID = m.Value
		case m.Is("order_no"):
			r.orderNo = m.Value
		case m.Is("provider"):
			r.provider = m.Value
		case m.Is("provider_txn_id"):
			r.providerTxnID = m.Value
		case m.Is("amount"):
			r.amount = m.Value
		case m.Is("currency"):
			r.currency = m.Value
		case m.Is("result"):
			r.result = m.Value
		case m.Is("paid_at"):
			r.paidAt = m.Value
		}
	}
	return r
}

// fieldTexts holds the string of each field of a callback, checked as stringField and checkText
// say, before amount, currency, result and paid_at are read for what they mean.
type fieldTexts struct {
	eventID, orderNo, provider, providerTxnID, amount, currency, result, paidAt string
}

// texts reads the string of each field, in the order of the contract; the first field that is
// missing, not a string, empty, or not a text fails them all.
func (r rawFields) texts() (fieldTexts, error) {
	var err error
	text := func(name string, raw []byte, required bool) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = stringField(name, raw, required)
		if err == nil && s != "" {
			err = checkText(name, s)
		}
		return s
	}
	f := fieldTexts{
		eventID:       text("event_id", r.eventID, false),
		orderNo:       text("order_no", r.orderNo, true),
		provider:      text("provider", r.provider, true),
		providerTxnID: text("provider_txn_id", r.providerTxnID, true),
		amount:        text("amount", r.amount, true),
		currency:      text("currency", r.currency, true),
		result:        text("result", r.result, true),
		paidAt:        text("paid_at", r.paidAt, true),
	}
	return f, err
}

// callback reads amount, currency, result and paid_at for what they mean, and returns the callback.
func (f fieldTexts) callback() (Callback, error) {
	cb := Callback{EventID: f.eventID, OrderNo: f.orderNo, Provider: f.provider, ProviderTxnID: f.providerTxnID}
	var err error
	if cb.Amount, err = parseAmount(f.amount); err != nil {
		return Callback{}, err
	}
	if !isCurrency(f.currency) {
		return Callback{}, invalid("currency", "must be three upper-case letters (ISO 4217), got %s", quote(f.currency))
	}
	cb.Currency = f.currency
	switch Result(f.result) {
	case Success, Failed:
		cb.Result = Result(f.result)
	default:
		return Callback{}, invalid("result", "must be SUCCESS or FAILED, got %s", quote(f.result))
	}
	if cb.PaidAt, err = rfc3339.Parse(f.paidAt); err != nil {
		return Callback{}, invalid("paid_at", "must be an RFC 3339 timestamp since 1970, got %s", quote(f.paidAt))
	}
	return cb, nil
}

// stringField returns the string of field name, whose raw JSON value is raw (nil when the object has
// no such member), which must be a JSON string when present. A missing or null field is "" (an error
// when required); an empty string is an error either way.
func stringField(name string, raw []byte, required bool) (string, error) {
	if raw == nil || string(raw) == "null" {
		if required {
			return "", invalid(name, "required")
		}
		return "", nil
	}
	if raw[0] != '"' {
		if name == "amount" {
			return "", invalid(name, "must be a JSON string holding a decimal (\"99.90\"), not a JSON %s", jsonKind(raw))
		}
		return "", invalid(name, "must be a JSON string, not a JSON %s", jsonKind(raw))
	}
	s, err := jsonobject.Unquote(raw)
	if err != nil {
		return "", invalid(name, "%v", err)
	}
	if s == "" {
		return "", invalid(name, "must not be empty")
	}
	return s, nil
}

// checkText enforces what every string field shares: at most maxTextLen characters and no control
// characters, as for an idempotency key; and, except for event_id, no surrounding white space, which
// would never match a stored order number or transaction id.
func checkText(name, s string) error {
	switch {
	case utf8.RuneCountInString(s) > maxTextLen:
		return invalid(name, "longer than %d characters", maxTextLen)
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return invalid(name, "contains a control character")
	case name != "event_id" && strings.TrimSpace(s) != s:
		return invalid(name, "has leading or trailing white space")
	}
	return nil
}

// parseAmount validates a decimal amount and returns it with exactly two places.
func parseAmount(s string) (string, error) {
	if strings.HasPrefix(s, "-") {
		return "", invalid("amount", "must not be negative, got %s", quote(s))
	}
	if !isAmount(s) {
		return "", invalid("amount", "must be a decimal with at most 2 places and 10 integer digits, like \"99.90\", got %s", quote(s))
	}
	whole, frac, _ := strings.Cut(s, ".")
	return whole + "." + (frac + "00")[:2], nil
}

// isAmount reports whether s is a decimal numeric(12,2) holds: one to ten integer digits, without
// a sign or leading zeros, then optionally a point and one or two places.
func isAmount(s string) bool {
	whole, places, point := strings.Cut(s, ".")
	return len(whole) >= 1 && len(whole) <= 10 && isDigits(whole) && (whole[0] != '0' || whole == "0") &&
		(!point || len(places) >= 1 && len(places) <= 2 && isDigits(places))
}

func isDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isCurrency reports whether s is three upper-case letters, as ISO 4217 codes are.
func isCurrency(s string) bool {
	return len(s) == 3 && isUpper(s[0]) && isUpper(s[1]) && isUpper(s[2])
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

func jsonKind(raw []byte) string {
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	default:
		return "number"
	}
}

// quote renders a rejected value for an error message, cut short: errors end up in dead-letter
// headers and logs, which need no more than a hint.
func quote(s string) string {
	const max = 40
	if utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max]) + "…"
	}
	return fmt.Sprintf("%q", s)
}
