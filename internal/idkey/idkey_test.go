package idkey_test

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/idkey"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	for _, tt := range keyTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key, reason, err := idkey.Of(tt.msg)
			if key != tt.wantKey || reason != tt.wantReason || (err != nil) != (tt.wantReason != "") {
				t.Errorf("IdempotencyKey() = %q, %q, %v; want %q, %q", key, reason, err, tt.wantKey, tt.wantReason)
			}
		})
	}
}

var keyTests = []struct {
	name       string
	msg        kafka.Message
	wantKey    string
	wantReason inboxtype.Reason
}{
	{"Header", msgWith(`{"event_id":"e"}`, "Idempotency-Key", "h"), "h", ""},
	{"HeaderAnyCase", msgWith(`{}`, "idempotency-key", "h"), "h", ""},
	{"FallbackHeader", msgWith(`{"event_id":"e"}`, "X-Idempotent-Key", "x"), "x", ""},
	{"HeaderFirst", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "X-Idempotent-Key", Value: []byte("x")}, {Key: "Idempotency-Key", Value: []byte("h")}}}, "h", ""},
	{"WebhookID", msgWith(`{"event_id":"e"}`, "webhook-id", "msg_1"), "msg_1", ""},
	{"WebhookIDAnyCase", msgWith(`{}`, "Webhook-Id", "msg_1"), "msg_1", ""},
	{"FallbackHeaderBeforeWebhookID", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "webhook-id", Value: []byte("w")}, {Key: "X-Idempotent-Key", Value: []byte("x")}}}, "x", ""},
	{"EventID", msgWith(`{"event_id":"e-1"}`, "", ""), "e-1", ""},
	{"Unicode", msgWith(`{"event_id":"订单-1"}`, "", ""), "订单-1", ""},
	{"Longest", msgWith(`{}`, "Idempotency-Key", strings.Repeat("é", 255)), strings.Repeat("é", 255), ""},
	{"None", msgWith(`{"id":"e"}`, "", ""), "", inboxtype.MissingIdempotencyKey},
	{"NullEventID", msgWith(`{"event_id":null}`, "", ""), "", inboxtype.MissingIdempotencyKey},
	// A value that is not JSON has no field to miss: it is a bad payload, however it mentions event_id.
	{"NotJSON", msgWith(`event_id=e`, "", ""), "", inboxtype.InvalidPayload},
	// A tombstone is nothing to apply, whatever its headers say.
	{"Tombstone", msgWith(``, "", ""), "", inboxtype.InvalidPayload},
	{"TombstoneWithKeyHeader", msgWith(``, "Idempotency-Key", "h"), "", inboxtype.InvalidPayload},
	{"EmptyValue", msgWith(``, "", ""), "", inboxtype.InvalidPayload},
	{"TrailingGarbage", msgWith(`{"event_id":"e"} x`, "", ""), "", inboxtype.InvalidPayload},
	{"TrailingComma", msgWith(`{"event_id":"e",}`, "", ""), "", inboxtype.InvalidPayload},
	{"Truncated", msgWith(`{"event_id":"e","order_no":"A-1"`, "", ""), "", inboxtype.InvalidPayload},
	{"NotJSONWithHeader", msgWith(`event_id=e`, "Idempotency-Key", "h"), "h", ""},
	{"JSONArray", msgWith(`[{"event_id":"e"}]`, "", ""), "", inboxtype.MissingIdempotencyKey},
	{"JSONString", msgWith(`"event_id"`, "", ""), "", inboxtype.MissingIdempotencyKey},
	{"NestedEventID", msgWith(`{"data":{"event_id":"e"}}`, "", ""), "", inboxtype.MissingIdempotencyKey},
	{"NumberEventID", msgWith(`{"event_id":42}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"EmptyEventID", msgWith(`{"event_id":""}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"TooLong", msgWith(`{}`, "Idempotency-Key", strings.Repeat("k", 256)), "", inboxtype.InvalidIdempotencyKey},
	{"ControlChar", msgWith(`{}`, "Idempotency-Key", "a\nb"), "", inboxtype.InvalidIdempotencyKey},
	{"C1Control", msgWith(`{}`, "Idempotency-Key", "a\u0085b"), "", inboxtype.InvalidIdempotencyKey},
	{"BadUTF8", msgWith(`{}`, "Idempotency-Key", "a\xffb"), "", inboxtype.InvalidIdempotencyKey},

	// JSON names are case-sensitive: only a member named exactly event_id is the key.
	{"EventIDCaseShadow", msgWith(`{"event_id":"k-real","v":1,"EVENT_ID":"k-shadow"}`, "", ""), "k-real", ""},
	{"EventIDCaseShadowFirst", msgWith(`{"Event_ID":"k-shadow","event_id":"k-real"}`, "", ""), "k-real", ""},
	{"EventIDOtherCaseOnly", msgWith(`{"EVENT_ID":"k"}`, "", ""), "", inboxtype.MissingIdempotencyKey},
	{"EventIDNameEscaped", msgWith(`{"event\u005fid":"e"}`, "", ""), "e", ""},

	// Unpaired UTF-16 surrogates decode to U+FFFD: two different keys would be one.
	{"UnpairedHighSurrogate", msgWith(`{"event_id":"\ud800"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"UnpairedLowSurrogate", msgWith(`{"event_id":"\udfff"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"HighSurrogateThenLetter", msgWith(`{"event_id":"k\uD800x"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"HighSurrogateThenEscape", msgWith(`{"event_id":"k\ud800\u0041"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"SurrogatesReversed", msgWith(`{"event_id":"\udc00\ud800"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"SurrogatePair", msgWith(`{"event_id":"k\ud83d\ude00"}`, "", ""), "k😀", ""},
	{"EscapedBackslashU", msgWith(`{"event_id":"\\ud800"}`, "", ""), `\ud800`, ""},
	{"ReplacementCharEscaped", msgWith(`{"event_id":"k\ufffd"}`, "", ""), "k\uFFFD", ""},
	{"ReplacementCharLiteral", msgWith("{\"event_id\":\"k\uFFFD\"}", "", ""), "k\uFFFD", ""},
	{"BadUTF8InEventID", msgWith("{\"event_id\":\"a\xffb\"}", "", ""), "", inboxtype.InvalidIdempotencyKey},

	// Keys a person cannot tell apart from another are refused, not trimmed.
	{"LeadingSpace", msgWith(`{}`, "Idempotency-Key", " k"), "", inboxtype.InvalidIdempotencyKey},
	{"TrailingSpaceEventID", msgWith(`{"event_id":"k "}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"OnlySpaces", msgWith(`{}`, "Idempotency-Key", "   "), "", inboxtype.InvalidIdempotencyKey},
	{"InnerSpace", msgWith(`{"event_id":"order 1"}`, "", ""), "order 1", ""},
	{"ZeroWidthSpace", msgWith(`{"event_id":"k\u200b"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"ByteOrderMark", msgWith(`{}`, "Idempotency-Key", "\ufeffk"), "", inboxtype.InvalidIdempotencyKey},
	{"SoftHyphen", msgWith(`{"event_id":"k\u00adk"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"NoBreakSpace", msgWith(`{"event_id":"a\u00a0b"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"IdeographicSpace", msgWith(`{"event_id":"a\u3000b"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"LineSeparator", msgWith(`{}`, "Idempotency-Key", "a\u2028b"), "", inboxtype.InvalidIdempotencyKey},

	// An empty header carries no key: the next source decides.
	{"EmptyHeader", msgWith(`{"event_id":"e"}`, "Idempotency-Key", ""), "e", ""},
	{"EmptyHeaderThenFallback", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "Idempotency-Key"}, {Key: "X-Idempotent-Key", Value: []byte("x")}}}, "x", ""},
	{"EmptyHeaderOnly", msgWith(`{}`, "Idempotency-Key", ""), "", inboxtype.MissingIdempotencyKey},

	// Two sources of one name that disagree: two readers would take different keys.
	{"DuplicateEventIDSame", msgWith(`{"event_id":"e","event_id":"\u0065"}`, "", ""), "e", ""},
	{"DuplicateEventIDDiffer", msgWith(`{"event_id":"e1","v":1,"event_id":"e2"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"DuplicateEventIDNull", msgWith(`{"event_id":null,"event_id":"e"}`, "", ""), "", inboxtype.InvalidIdempotencyKey},
	{"DuplicateHeaderSame", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("h")}, {Key: "idempotency-key", Value: []byte("h")}}}, "h", ""},
	{"DuplicateHeaderDiffer", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("h1")}, {Key: "Idempotency-Key", Value: []byte("h2")}}}, "", inboxtype.InvalidIdempotencyKey},
	{"DuplicateHeaderOneEmpty", kafka.Message{Value: []byte(`{}`), Headers: []kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("h")}, {Key: "Idempotency-Key"}}}, "h", ""},
}

// TestIdempotencyKeyErrors checks what the errors say: the dead letter's dlq-error.
func TestIdempotencyKeyErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		value, want string
	}{
		{`event_id=e`, "not valid JSON (and no header Idempotency-Key, X-Idempotent-Key or webhook-id to take the idempotency key from)"},
		{`{"event_id":"e",}`, "not valid JSON (and no header Idempotency-Key, X-Idempotent-Key or webhook-id to take the idempotency key from)"},
		{`{"id":"e"}`, "no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, no JSON field event_id"},
		{`[{"event_id":"e"}]`, "no idempotency key: no header Idempotency-Key, X-Idempotent-Key or webhook-id, and the value is not a JSON object"},
		{``, "empty value (tombstone): nothing to apply"},
	} {
		_, _, err := idkey.Of(msgWith(tt.value, "", ""))
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: error %v, want %q", tt.value, err, tt.want)
		}
	}
}

func msgWith(value, headerKey, headerValue string) kafka.Message {
	m := kafka.Message{Value: []byte(value)}
	if headerKey != "" {
		m.Headers = []kafka.Header{{Key: headerKey, Value: []byte(headerValue)}}
	}
	return m
}

// indistinct reports whether r is a character a person cannot see or cannot tell from another in a
// key: a control or format character, or white space other than an inner ASCII space.
func indistinct(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || (unicode.IsSpace(r) && r != ' ')
}

func FuzzIdempotencyKey(f *testing.F) {
	for _, tt := range keyTests {
		var h string
		if len(tt.msg.Headers) > 0 {
			h = string(tt.msg.Headers[0].Value)
		}
		f.Add(string(tt.msg.Value), h)
	}
	f.Fuzz(func(t *testing.T, value, headerValue string) {
		for _, m := range []kafka.Message{msgWith(value, "", ""), msgWith(value, "Idempotency-Key", headerValue)} {
			key, reason, err := idkey.Of(m)
			switch {
			case err != nil && (key != "" || reason == ""):
				t.Fatalf("failed with key %q and reason %q", key, reason)
			case err == nil && (reason != "" || key == "" || len([]rune(key)) > 255):
				t.Fatalf("accepted key %q with reason %q", key, reason)
			case err == nil && (!utf8.ValidString(key) || strings.ContainsFunc(key, indistinct)):
				t.Fatalf("accepted key %q: not printable", key)
			case err == nil && strings.TrimSpace(key) != key:
				t.Fatalf("accepted key %q: leading or trailing space", key)
			case err == nil && strings.ContainsRune(key, utf8.RuneError) && !strings.ContainsRune(value+headerValue, utf8.RuneError) &&
				!strings.Contains(strings.ToLower(value), `\ufffd`):
				t.Fatalf("accepted key %q: a replacement character that is in no source", key)
			}
		}
	})
}

// BenchmarkIdempotencyKey reads the key of a payment callback from its event_id.
func BenchmarkIdempotencyKey(b *testing.B) {
	m := msgWith(`{"event_id":"evt-000123","order_no":"A-1001","provider":"alipay","provider_txn_id":"T-1",`+
		`"amount":"99.90","currency":"CNY","result":"SUCCESS","paid_at":"2026-11-30T12:00:00Z"}`, "", "")
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := idkey.Of(m); err != nil {
			b.Fatal(err)
		}
	}
}
