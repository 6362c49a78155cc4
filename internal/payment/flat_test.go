package payment

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"unicode/utf8"
)

// FuzzFlatObject checks that flatObject, where it accepts a document, gives what json.Unmarshal
// gives.
func FuzzFlatObject(f *testing.F) {
	for _, seed := range []string{
		`{"event_id":"e1","order_no":"ORD-1","amount":"99.90","paid_at":null}`,
		` { "a" : "x" , "a":"y" } `, `{}`, `{"a":"\u00e9"}`, `{"a":1}`, `{"a":"x",}`, `{"a":"x"} x`,
		`{"a":nul}`, `{"a":null1}`, `{"a":"é"}`, "{\"a\":\"\t\"}", `[]`, `{"a":"x"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		if !utf8.Valid(value) {
			return
		}
		got, ok := flatObject(value)
		if !ok {
			return
		}
		var want map[string]json.RawMessage
		if err := json.Unmarshal(value, &want); err != nil {
			t.Fatalf("flatObject accepted %q, which json.Unmarshal refuses: %v", value, err)
		}
		if !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return slices.Equal(a, b) }) {
			t.Fatalf("flatObject(%q) = %q, json.Unmarshal gives %q", value, got, want)
		}
	})
}
