package payment_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/payment"
)

// callbackJSON returns a valid callback with fields changed: a nil value removes the field.
func callbackJSON(t testing.TB, changes map[string]any) []byte {
	t.Helper()
	fields := map[string]any{
		"event_id":        "evt-1",
		"order_no":        "ORD-1",
		"provider":        "alipay",
		"provider_txn_id": "T1",
		"amount":          "99.90",
		"currency":        "CNY",
		"result":          "SUCCESS",
		"paid_at":         "2024-05-01T10:00:00Z",
	}
	for k, v := range changes {
		if v == nil {
			delete(fields, k)
		} else {
			fields[k] = v
		}
	}
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type decodeCase struct {
	name  string
	value []byte
	// want is checked on a valid callback; field names the field an invalid one is refused for.
	want  func(payment.Callback) bool
	field string
}

func decodeCases(t testing.TB) []decodeCase {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	c := func(changes map[string]any) []byte { return callbackJSON(t, changes) }
	long := strings.Repeat("x", 256)
	return []decodeCase{
		{name: "Valid", value: c(nil), want: func(cb payment.Callback) bool {
			return cb == payment.Callback{EventID: "evt-1", OrderNo: "ORD-1", Provider: "alipay",
				ProviderTxnID: "T1", Amount: "99.90", Currency: "CNY", Result: payment.Success,
				PaidAt: time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)}
		}},
		{name: "Failed", value: c(map[string]any{"result": "FAILED"}),
			want: func(cb payment.Callback) bool { return cb.Result == payment.Failed }},
		{name: "NoEventID", value: c(map[string]any{"event_id": nil}),
			want: func(cb payment.Callback) bool { return cb.EventID == "" }},
		{name: "NullEventID", value: c(map[string]any{"event_id": raw("null")}),
			want: func(cb payment.Callback) bool { return cb.EventID == "" }},
		{name: "UnknownFieldsIgnored", value: c(map[string]any{"extra": map[string]any{"a": 1}, "Amount": 5}),
			want: func(cb payment.Callback) bool { return cb.Amount == "99.90" }},
		{name: "WholeAmount", value: c(map[string]any{"amount": "100"}),
			want: func(cb payment.Callback) bool { return cb.Amount == "100.00" }},
		{name: "OnePlaceAmount", value: c(map[string]any{"amount": "99.9"}),
			want: func(cb payment.Callback) bool { return cb.Amount == "99.90" }},
		{name: "ZeroAmount", value: c(map[string]any{"amount": "0.00"}),
			want: func(cb payment.Callback) bool { return cb.Amount == "0.00" }},
		{name: "LargestAmount", value: c(map[string]any{"amount": "9999999999.99"}),
			want: func(cb payment.Callback) bool { return cb.Amount == "9999999999.99" }},
		{name: "PaidAtLowercase", value: c(map[string]any{"paid_at": "2024-05-01t10:00:00z"}),
			want: func(cb payment.Callback) bool { return cb.PaidAt.Equal(time.Date(2024, 5, 1, 10, 0, 0, 0, time.UTC)) }},
		{name: "PaidAtWithOffsetAndFraction", value: c(map[string]any{"paid_at": "2024-05-01T18:00:00.123+08:00"}),
			want: func(cb payment.Callback) bool {
				return cb.PaidAt.Equal(time.Date(2024, 5, 1, 10, 0, 0, 123e6, time.UTC))
			}},
		{name: "LongestOrderNo", value: c(map[string]any{"order_no": long[:255]}),
			want: func(cb payment.Callback) bool { return len(cb.OrderNo) == 255 }},
		{name: "LongestUnicodeOrderNo", value: c(map[string]any{"order_no": strings.Repeat("号", 255)}),
			want: func(cb payment.Callback) bool { return cb.OrderNo == strings.Repeat("号", 255) }},
		{name: "PaddedEventID", value: c(map[string]any{"event_id": " evt-1 "}),
			want: func(cb payment.Callback) bool { return cb.EventID == " evt-1 " }},
		{name: "UnicodeProvider", value: c(map[string]any{"provider": "支付宝"}),
			want: func(cb payment.Callback) bool { return cb.Provider == "支付宝" }},

		{name: "NotJSON", value: []byte(`order_no=1`), field: "payload"},
		{name: "Empty", value: []byte(``), field: "payload"},
		{name: "Null", value: []byte(`null`), field: "payload"},
		{name: "Array", value: []byte(`[{"order_no":"1"}]`), field: "payload"},
		{name: "TrailingData", value: append(c(nil), `{}`...), field: "payload"},
		{name: "InvalidUTF8", value: []byte("{\"order_no\":\"\xff\"}"), field: "payload"},
		{name: "MissingOrderNo", value: c(map[string]any{"order_no": nil}), field: "order_no"},
		{name: "NullOrderNo", value: c(map[string]any{"order_no": raw("null")}), field: "order_no"},
		{name: "EmptyOrderNo", value: c(map[string]any{"order_no": ""}), field: "order_no"},
		{name: "NumericOrderNo", value: c(map[string]any{"order_no": 12345}), field: "order_no"},
		{name: "LongOrderNo", value: c(map[string]any{"order_no": long}), field: "order_no"},
		{name: "PaddedOrderNo", value: c(map[string]any{"order_no": " ORD-1"}), field: "order_no"},
		{name: "ControlInOrderNo", value: c(map[string]any{"order_no": "ORD\n1"}), field: "order_no"},
		{name: "MissingProvider", value: c(map[string]any{"provider": nil}), field: "provider"},
		{name: "ObjectProvider", value: c(map[string]any{"provider": map[string]any{}}), field: "provider"},
		{name: "MissingTxnID", value: c(map[string]any{"provider_txn_id": nil}), field: "provider_txn_id"},
		{name: "BooleanTxnID", value: c(map[string]any{"provider_txn_id": true}), field: "provider_txn_id"},
		{name: "MissingAmount", value: c(map[string]any{"amount": nil}), field: "amount"},
		{name: "NumberAmount", value: c(map[string]any{"amount": json.Number("99.90")}), field: "amount"},
		{name: "EmptyAmount", value: c(map[string]any{"amount": ""}), field: "amount"},
		{name: "NegativeAmount", value: c(map[string]any{"amount": "-1.00"}), field: "amount"},
		{name: "ThreePlacesAmount", value: c(map[string]any{"amount": "99.901"}), field: "amount"},
		{name: "ExponentAmount", value: c(map[string]any{"amount": "1e2"}), field: "amount"},
		{name: "CommaAmount", value: c(map[string]any{"amount": "99,90"}), field: "amount"},
		{name: "LeadingZeroAmount", value: c(map[string]any{"amount": "099.90"}), field: "amount"},
		{name: "BareDotAmount", value: c(map[string]any{"amount": "99."}), field: "amount"},
		{name: "PlusAmount", value: c(map[string]any{"amount": "+99.90"}), field: "amount"},
		{name: "NaNAmount", value: c(map[string]any{"amount": "NaN"}), field: "amount"},
		{name: "TooLargeAmount", value: c(map[string]any{"amount": "10000000000.00"}), field: "amount"},
		{name: "MissingCurrency", value: c(map[string]any{"currency": nil}), field: "currency"},
		{name: "LowerCaseCurrency", value: c(map[string]any{"currency": "cny"}), field: "currency"},
		{name: "LongCurrency", value: c(map[string]any{"currency": "CNYY"}), field: "currency"},
		{name: "SymbolCurrency", value: c(map[string]any{"currency": "¥"}), field: "currency"},
		{name: "MissingResult", value: c(map[string]any{"result": nil}), field: "result"},
		{name: "LowerCaseResult", value: c(map[string]any{"result": "success"}), field: "result"},
		{name: "PendingResult", value: c(map[string]any{"result": "PENDING"}), field: "result"},
		{name: "MissingPaidAt", value: c(map[string]any{"paid_at": nil}), field: "paid_at"},
		{name: "UnsetPaidAt", value: c(map[string]any{"paid_at": "0001-01-01T00:00:00Z"}), field: "paid_at"},
		{name: "Offset24hPaidAt", value: c(map[string]any{"paid_at": "2024-05-01T10:00:00+24:00"}), field: "paid_at"},
		{name: "DateOnlyPaidAt", value: c(map[string]any{"paid_at": "2024-05-01"}), field: "paid_at"},
		{name: "NoZonePaidAt", value: c(map[string]any{"paid_at": "2024-05-01T10:00:00"}), field: "paid_at"},
		{name: "UnixPaidAt", value: c(map[string]any{"paid_at": 1714557600}), field: "paid_at"},
		{name: "NumericEventID", value: c(map[string]any{"event_id": 7}), field: "event_id"},
		{name: "EmptyEventID", value: c(map[string]any{"event_id": ""}), field: "event_id"},
		{name: "LongEventID", value: c(map[string]any{"event_id": long}), field: "event_id"},
		{name: "LongUnicodeTxnID", value: c(map[string]any{"provider_txn_id": strings.Repeat("号", 256)}), field: "provider_txn_id"},
		{name: "ControlInEventID", value: c(map[string]any{"event_id": "evt\u00001"}), field: "event_id"},
	}
}

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, tc := range decodeCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cb, err := payment.Decode(tc.value)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Decode(%s): %v", tc.value, err)
				}
				if !tc.want(cb) {
					t.Fatalf("Decode(%s) = %+v", tc.value, cb)
				}
				return
			}
			field := checkInvalid(t, err)
			if field != tc.field {
				t.Fatalf("Decode(%s): refused field %q, want %q (%v)", tc.value, field, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("error %q does not name the field %q", err, tc.field)
			}
		})
	}
}

// checkInvalid asserts that err is an invalid_payload fault carrying a *payment.FieldError, and
// returns the field.
func checkInvalid(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		t.Fatal("got nil error, want invalid_payload")
	}
	kind, reason, _ := fault.Classify(err)
	if kind != fault.KindPermanent || reason != inboxtype.InvalidPayload {
		t.Fatalf("classified %v/%s, want permanent/%s: %v", kind, reason, inboxtype.InvalidPayload, err)
	}
	var fe *payment.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("no *payment.FieldError in %v", err)
	}
	return fe.Field
}

var (
	validAmount   = regexp.MustCompile(`^(0|[1-9][0-9]{0,9})\.[0-9]{2}$`)
	validCurrency = regexp.MustCompile(`^[A-Z]{3}$`)
)

// FuzzDecode checks that any value decodes to either a callback satisfying every rule or an
// invalid_payload error naming a field, and never panics.
func FuzzDecode(f *testing.F) {
	for _, tc := range decodeCases(f) {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		cb, err := payment.Decode(value)
		if err != nil {
			if field := checkInvalid(t, err); field == "" {
				t.Fatalf("error names no field: %v", err)
			}
			return
		}
		for name, s := range map[string]string{"order_no": cb.OrderNo, "provider": cb.Provider,
			"provider_txn_id": cb.ProviderTxnID} {
			if s == "" || utf8.RuneCountInString(s) > 255 || strings.TrimSpace(s) != s {
				t.Fatalf("accepted %s %q", name, s)
			}
		}
		if utf8.RuneCountInString(cb.EventID) > 255 {
			t.Fatalf("accepted event_id of %d characters", utf8.RuneCountInString(cb.EventID))
		}
		if !validAmount.MatchString(cb.Amount) || !validCurrency.MatchString(cb.Currency) {
			t.Fatalf("accepted amount %q currency %q", cb.Amount, cb.Currency)
		}
		if cb.Result != payment.Success && cb.Result != payment.Failed {
			t.Fatalf("accepted result %q", cb.Result)
		}
	})
}

// BenchmarkDecode decodes a typical callback.
func BenchmarkDecode(b *testing.B) {
	value := callbackJSON(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := payment.Decode(value); err != nil {
			b.Fatal(err)
		}
	}
}
