package notify_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// TestAcceptedWhateverTheID: once the provider accepted (2xx), nothing in its answer makes recording
// the SMS fail. Each odd answer goes through the HTTP sender and into a notifications row in Postgres:
// a failure there would be a handler error, and a replay would send the SMS again.
func TestAcceptedWhateverTheID(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, tt := range []struct {
		name, body string
		want       string // the stored provider_message_id; "" for NULL
	}{
		{name: "Plain", body: `{"id":"m-1"}`, want: "m-1"},
		{name: "NUL", body: `{"id":"abc\u0000def"}`, want: "abc\uFFFDdef"},
		{name: "OnlyNUL", body: `{"id":"\u0000"}`, want: "\uFFFD"},
		{name: "ControlCharacters", body: `{"id":"a\u0007b\nc\u0085"}`, want: "a\uFFFDb\uFFFDc\uFFFD"},
		{name: "InvalidUTF8", body: "{\"id\":\"ab\xff\xfecd\"}", want: "ab\uFFFD\uFFFDcd"},
		{name: "LoneSurrogate", body: `{"id":"x\ud800"}`, want: "x\uFFFD"},
		{name: "Huge", body: `{"id":"` + strings.Repeat("x", 10000) + `"}`, want: strings.Repeat("x", 255)},
		{name: "HugeMultibyte", body: `{"id":"` + strings.Repeat("é", 200) + `"}`, want: strings.Repeat("é", 127)},
		{name: "BeyondTheReadLimit", body: `{"id":"` + strings.Repeat("x", 100<<10) + `"}`},
		{name: "Number", body: `{"id":12345}`, want: "12345"},
		{name: "Float", body: `{"id":1.5e3}`, want: "1.5e3"},
		{name: "HugeNumber", body: `{"id":` + strings.Repeat("9", 400) + `}`, want: strings.Repeat("9", 255)},
		{name: "Object", body: `{"id":{"value":"m-1"}}`},
		{name: "Array", body: `{"id":["m-1"]}`},
		{name: "Bool", body: `{"id":true}`},
		{name: "Null", body: `{"id":null}`},
		{name: "Spaces", body: `{"id":"   "}`},
		{name: "NotJSON", body: `<html>accepted</html>`},
		{name: "Empty", body: ``},
		{name: "TopLevelString", body: `"m-1"`},
		{name: "OtherCase", body: `{"ID":"m-1"}`, want: "m-1"},
		// Two ids: which one the provider means is anyone's guess (encoding/json takes the last, others
		// the first), so neither is recorded; the same id twice is one id.
		{name: "TwoIDs", body: `{"id":"m-1","status":"queued","id":"m-2"}`},
		{name: "TwoIDsOtherCase", body: `{"id":"m-1","Id":"m-2"}`},
		{name: "TwoIDsOneNull", body: `{"id":"m-1","id":null}`},
		{name: "SameIDTwice", body: `{"id":"m-1","id":"m\u002d1"}`, want: "m-1"},
		{name: "SameNumberTwice", body: `{"id":12345,"id":"12345"}`, want: "12345"},
		{name: "NestedID", body: `{"data":{"id":"m-1"}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, tt.body)
			})
			key := "k-" + tt.name
			outcome, err := e.process(t, e.newHandler(t, sender), key, testEvent, 1)
			if err != nil || outcome != inbox.Applied {
				t.Fatalf("Process = %q, %v; want applied", outcome, err)
			}
			n, inInbox := e.recorded(t, key)
			if n == nil || !inInbox || n.status != "SENT" {
				t.Fatalf("notification %+v, inbox row %v; want SENT and the inbox row", n, inInbox)
			}
			switch {
			case tt.want == "" && n.providerMessageID != nil:
				t.Fatalf("stored id %s, want NULL", short(n.providerMessageID))
			case tt.want != "" && (n.providerMessageID == nil || *n.providerMessageID != tt.want):
				t.Fatalf("stored id %v, want %s", short(n.providerMessageID), short(&tt.want))
			}

			id, err := sender.Send(context.Background(), testSMS)
			if err != nil || id != tt.want {
				t.Fatalf("Send = %s, %v; want %s", short(&id), err, short(&tt.want))
			}
			if !utf8.ValidString(id) || len(id) > 255 || strings.ContainsRune(id, 0) {
				t.Fatalf("Send = %s: not storable", short(&id))
			}
		})
	}
}

// short quotes the start of an id and gives its length.
func short(id *string) string {
	if id == nil {
		return "NULL"
	}
	s := *id
	if len(s) > 40 {
		s = s[:40]
	}
	return fmt.Sprintf("%q (%d bytes)", s, len(*id))
}
