// Package jsonobject reads the top level of one JSON object: its members in order, each by its exact
// name, with its value raw, a name given twice seen twice. It checks the whole document with
// json.Valid and then walks only the top level, decoding neither the names nor the values; a caller
// decodes the values it needs.
//
// It does not decide what a name given twice means (the last one, the first one, or an error), nor
// match names case-insensitively as encoding/json does for struct fields: that is the caller's rule.
// It does not check UTF-8 either, which json.Valid does not: a caller that needs valid UTF-8 checks it.
package jsonobject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strings"
	"unicode/utf8"
)

// ErrNotObject is the error of Parse for a document that is not one JSON object.
var ErrNotObject = errors.New("not a JSON object")

// Object is a valid JSON document that is one object.
type Object struct {
	doc   []byte
	start int // just past the '{'
}

// Parse checks that doc is one valid JSON object, white space around it allowed. Its error is
// ErrNotObject, wrapped with encoding/json's syntax error when doc begins with '{' but is not valid.
func Parse(doc []byte) (Object, error) {
	i := skipSpace(doc, 0)
	if i == len(doc) || doc[i] != '{' {
		return Object{}, ErrNotObject
	}
	if !json.Valid(doc) {
		var v json.RawMessage
		return Object{}, fmt.Errorf("%w: %v", ErrNotObject, json.Unmarshal(doc, &v))
	}
	return Object{doc: doc, start: i + 1}, nil
}

// Member is one member of an object's top level. Its slices share the document's memory.
type Member struct {
	// name is the member's name as the document writes it: a JSON string, quotes included.
	name []byte
	// Value is the member's value as the document writes it, without the white space around it.
	Value []byte
}

// Is reports whether the member's name is exactly name, however the document writes it: "event_id"
// and "event\u005fid" are both event_id; "Event_ID" is not. In a document that is not valid UTF-8
// (json.Valid accepts one), an invalid byte of a name is compared as it is, or, in a name with an
// escape, read as U+FFFD as encoding/json reads it: a caller to whom that matters checks utf8.Valid.
func (m Member) Is(name string) bool {
	// An escape is longer than the text it stands for: a written name no longer than name is
	// name only when it has no escape and is name.
	written := m.name[1 : len(m.name)-1]
	switch {
	case len(written) < len(name):
		return false
	case len(written) == len(name):
		return string(written) == name && strings.IndexByte(name, '\\') < 0
	case bytes.IndexByte(written, '\\') < 0:
		return false
	}
	var s string
	return json.Unmarshal(m.name, &s) == nil && s == name
}

// Members returns the object's top-level members, in the document's order.
func (o Object) Members() iter.Seq[Member] {
	return func(yield func(Member) bool) {
		b := o.doc
		i := skipSpace(b, o.start)
		for b[i] != '}' {
			nameEnd := skipValue(b, i)
			name := b[i:nameEnd]
			i = skipSpace(b, skipSpace(b, nameEnd)+1) // past the ':'
			end := skipValue(b, i)
			if !yield(Member{name: name, Value: b[i:end]}) {
				return
			}
			i = skipSpace(b, end)
			if b[i] == ',' {
				i = skipSpace(b, i+1)
			}
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the end of the valid JSON value that starts at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of a number or a literal
			}
			depth--
			if depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i // the end of a number or a literal
			}
		}
	}
	return i
}

// Unquote returns what encoding/json decodes the JSON string raw to; its error is encoding/json's,
// for a raw value that is not one. Most strings have no escape and are valid UTF-8: their text is
// what is between the quotes, and encoding/json need not run.
func Unquote(raw []byte) (string, error) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		text := raw[1 : len(raw)-1]
		if isPlain(text) {
			return string(text), nil
		}
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// isPlain reports whether text, between a JSON string's quotes, is its text: valid UTF-8 with no
// escape, quote or control character.
func isPlain(text []byte) bool {
	for _, c := range text {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(text)
}
