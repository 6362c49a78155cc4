package jsonobject_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker/internal/jsonobject"
)

// member is a member as a test states it: the decoded name and the raw value.
type member struct{ name, value string }

var parseTests = []struct {
	name string
	doc  string
	want []member // nil with notObject
	// notObject: Parse refuses doc.
	notObject bool
}{
	{name: "Empty", doc: `{}`, want: []member{}},
	{name: "EmptySpaced", doc: " \t\r\n{ \n } \n", want: []member{}},
	{name: "Strings", doc: `{"event_id":"e-1","order_no":"A-1"}`,
		want: []member{{"event_id", `"e-1"`}, {"order_no", `"A-1"`}}},
	{name: "EveryKind", doc: `{"s":"x","n":-1.5e3,"t":true,"f":false,"z":null,"o":{"a":[1,{"b":"}"}]},"a":[],"e":""}`,
		want: []member{{"s", `"x"`}, {"n", `-1.5e3`}, {"t", `true`}, {"f", `false`}, {"z", `null`},
			{"o", `{"a":[1,{"b":"}"}]}`}, {"a", `[]`}, {"e", `""`}}},
	{name: "SpacesAround", doc: "{ \"a\" :\t1 ,\n\"b\" : \"x\" \r\n}",
		want: []member{{"a", `1`}, {"b", `"x"`}}},
	{name: "NumberLast", doc: `{"a":12}`, want: []member{{"a", `12`}}},
	{name: "StringsWithStructure", doc: `{"a":"{\"b\":[1,2]}","c\"d":"x\\","e":"]"}`,
		want: []member{{"a", `"{\"b\":[1,2]}"`}, {`c"d`, `"x\\"`}, {"e", `"]"`}}},
	{name: "UnicodeNames", doc: `{"订单":"号","\u00e9":1}`, want: []member{{"订单", `"号"`}, {"é", `1`}}},

	// Only the top level: a nested member of the same name is a part of a value.
	{name: "Nested", doc: `{"data":{"event_id":"e"}}`, want: []member{{"data", `{"event_id":"e"}`}}},
	// Names are exact: case differs, names differ.
	{name: "CaseShadow", doc: `{"event_id":"k-real","v":1,"EVENT_ID":"k-shadow"}`,
		want: []member{{"event_id", `"k-real"`}, {"v", `1`}, {"EVENT_ID", `"k-shadow"`}}},
	{name: "NameEscaped", doc: `{"event\u005fid":"e"}`, want: []member{{"event_id", `"e"`}}},
	// A name given twice is seen twice, in order.
	{name: "Duplicates", doc: `{"event_id":"e1","v":1,"event_id":"e2"}`,
		want: []member{{"event_id", `"e1"`}, {"v", `1`}, {"event_id", `"e2"`}}},
	{name: "DuplicateNull", doc: `{"event_id":null,"event_id":"e"}`,
		want: []member{{"event_id", `null`}, {"event_id", `"e"`}}},

	{name: "NotJSON", doc: `event_id=e`, notObject: true},
	{name: "EmptyDocument", doc: ``, notObject: true},
	{name: "OnlySpace", doc: " \n", notObject: true},
	{name: "Null", doc: `null`, notObject: true},
	{name: "Array", doc: `[{"event_id":"e"}]`, notObject: true},
	{name: "String", doc: `"{}"`, notObject: true},
	{name: "TrailingGarbage", doc: `{"event_id":"e"} x`, notObject: true},
	{name: "TwoObjects", doc: `{}{}`, notObject: true},
	{name: "Unterminated", doc: `{"event_id":"e"`, notObject: true},
	{name: "TrailingComma", doc: `{"a":1,}`, notObject: true},
	{name: "BareName", doc: `{a:1}`, notObject: true},
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tt := range parseTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			obj, err := jsonobject.Parse([]byte(tt.doc))
			if tt.notObject {
				if !errors.Is(err, jsonobject.ErrNotObject) {
					t.Fatalf("Parse(%q) = %v, want ErrNotObject", tt.doc, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.doc, err)
			}
			var got []member
			for m := range obj.Members() {
				if !m.Is(tt.want[min(len(got), len(tt.want)-1)].name) {
					t.Errorf("member %d of %q: name is not %q", len(got), tt.doc, tt.want[len(got)].name)
				}
				got = append(got, member{tt.want[min(len(got), len(tt.want)-1)].name, string(m.Value)})
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("members of %q = %q, want %q", tt.doc, got, tt.want)
			}
		})
	}
}

func TestParseSyntaxError(t *testing.T) {
	t.Parallel()
	_, err := jsonobject.Parse([]byte(`{"a":1} x`))
	var syntax *json.SyntaxError
	if !errors.Is(err, jsonobject.ErrNotObject) || !strings.Contains(err.Error(), "invalid character 'x'") {
		t.Fatalf("Parse: %v, want ErrNotObject with encoding/json's reason", err)
	}
	if errors.As(err, &syntax) {
		t.Fatalf("Parse: %v wraps encoding/json's error type, which is not part of its contract", err)
	}
}

func TestMemberIs(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		doc, name string
		want      bool
	}{
		{`{"event_id":1}`, "event_id", true},
		{`{"event\u005fid":1}`, "event_id", true},
		{`{"\u0065vent_id":1}`, "event_id", true},
		{`{"event_id":1}`, "Event_ID", false},
		{`{"EVENT_ID":1}`, "event_id", false},
		{`{"event_id ":1}`, "event_id", false},
		{`{"event":1}`, "event_id", false},
		{`{"event_id_2":1}`, "event_id", false},
		{`{"":1}`, "", true},
		{`{"a\"b":1}`, `a"b`, true},
		{`{"a\\":1}`, `a\`, true},
		{`{"a\\":1}`, `a\\`, false},
		// An unpaired surrogate decodes to U+FFFD, as encoding/json decodes it.
		{`{"\ud800":1}`, "\uFFFD", true},
	} {
		obj, err := jsonobject.Parse([]byte(tt.doc))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tt.doc, err)
		}
		for m := range obj.Members() {
			if got := m.Is(tt.name); got != tt.want {
				t.Errorf("name of %s Is(%q) = %v, want %v", tt.doc, tt.name, got, tt.want)
			}
		}
	}
}

func TestMembersStop(t *testing.T) {
	t.Parallel()
	obj, err := jsonobject.Parse([]byte(`{"a":1,"b":2,"c":3}`))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for m := range obj.Members() {
		seen = append(seen, string(m.Value))
		if m.Is("b") {
			break
		}
	}
	if !slices.Equal(seen, []string{"1", "2"}) {
		t.Fatalf("values before the break: %q", seen)
	}
}

func TestUnquote(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`""`, `"a"`, `"订单-1"`, `"a\"b"`, `"\u0065"`, `"\ud800"`, `"k\ud83d\ude00"`,
		"\"a\xffb\"", `"a\tb"`, "\"a\tb\"", `"a"b"`, `"a`, `a"`, `"`, ``, `null`, `1`, `{}`, `["a"]`} {
		checkUnquote(t, []byte(raw))
	}
}

// checkUnquote checks that Unquote(raw) is what encoding/json decodes raw to.
func checkUnquote(t *testing.T, raw []byte) {
	t.Helper()
	var want string
	wantErr := json.Unmarshal(raw, &want)
	got, err := jsonobject.Unquote(raw)
	if got != want || (err == nil) != (wantErr == nil) {
		t.Fatalf("Unquote(%q) = %q, %v; encoding/json: %q, %v", raw, got, err, want, wantErr)
	}
}

// referenceMembers reads doc's top-level members with encoding/json's token reader: decoded names
// and raw values. ok is false when encoding/json does not read doc as one object.
func referenceMembers(doc []byte) (members []member, ok bool) {
	if !json.Valid(doc) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, false
		}
		members = append(members, member{tok.(string), string(value)})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return members, true
}

// FuzzParse checks Parse and Members against encoding/json: the same documents refused, the same
// members in the same order, names that match exactly the decoded name (in a valid UTF-8 document).
func FuzzParse(f *testing.F) {
	for _, tt := range parseTests {
		f.Add([]byte(tt.doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		want, ok := referenceMembers(doc)
		obj, err := jsonobject.Parse(doc)
		if (err == nil) != ok {
			t.Fatalf("Parse(%q): %v; encoding/json reads it as an object: %v", doc, err, ok)
		}
		if !ok {
			return
		}
		i := 0
		for m := range obj.Members() {
			if i >= len(want) {
				t.Fatalf("%q: more members than encoding/json reads (%q)", doc, want)
			}
			// encoding/json reads an invalid byte as U+FFFD; Is compares it as it is written.
			if utf8.Valid(doc) && !m.Is(want[i].name) || m.Is(want[i].name+"x") || (want[i].name != "" && m.Is(want[i].name[1:])) {
				t.Fatalf("%q: member %d is not named exactly %q", doc, i, want[i].name)
			}
			if !bytes.Equal(m.Value, []byte(want[i].value)) {
				t.Fatalf("%q: member %d has value %q, want %q", doc, i, m.Value, want[i].value)
			}
			checkUnquote(t, m.Value)
			i++
		}
		if i != len(want) {
			t.Fatalf("%q: %d members, encoding/json reads %d", doc, i, len(want))
		}
	})
}
