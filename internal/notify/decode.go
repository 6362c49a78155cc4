package notify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/inboxworker/inboxworker"
	"github.com/inboxworker/inboxworker/internal/rfc3339"
)

// Limits of an SMS event. A template is a name the provider knows, not the text of the message;
// params fill its placeholders.
const (
	MaxTemplateLen   = 100
	MaxParams        = 32
	MaxParamNameLen  = 64
	MaxParamValueLen = 1000
)

// Decode parses and validates the value of an SMS event (see the contract):
//
//	{"event_id":"…","phone":"+8613800138000","template":"verify_code","params":{"code":"123456"},
//	 "expires_at":"2026-01-02T15:04:05Z"}
//
// phone is required, in E.164; template is required, 1 to MaxTemplateLen characters of A–Z, a–z,
// 0–9, '_', '.', '-'; params is optional, an object of at most MaxParams string values whose names
// follow the same rule but start with a letter or '_'; expires_at is optional, an RFC 3339 time
// with its zone (after it the SMS is not sent: see Handler.Check); event_id is optional and, when
// present, a string (the consumer reads the idempotency key, not Decode). Unknown fields are ignored, so that producers can add fields before the worker
// knows them. Names match exactly ("PHONE" is an unknown field), and a field of the event given twice,
// or a param name given twice, is refused: readers that take the first and readers that take the last
// would send different messages, or to different people. An unknown field given twice is ignored.
//
// Any other value is refused with inboxworker.Permanent(inboxworker.InvalidPayload, …) naming the field. The
// error never quotes the value it refuses, so a phone number in the wrong place cannot reach a log
// line or a dead-letter header through it. The returned SMS has no Key: the idempotency key comes
// with the delivery.
func Decode(value []byte) (SMS, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(value, &fields); err != nil || fields == nil {
		return SMS{}, invalid("value", notAnObject(value, err))
	}
	if name, ok := duplicateName(value, "event_id", "phone", "template", "params", "expires_at"); ok {
		return SMS{}, invalid(name, errors.New("appears more than once"))
	}
	var sms SMS
	if raw, ok := fields["event_id"]; ok && kind(raw) != "null" {
		if kind(raw) != "string" {
			return SMS{}, invalid("event_id", fmt.Errorf("must be a string, got %s", kind(raw)))
		}
	}

	phone, err := requiredString(fields, "phone")
	if err != nil {
		return SMS{}, err
	}
	if !ValidPhone(phone) {
		return SMS{}, invalid("phone", fmt.Errorf(
			"must be in E.164 format: '+' then 8 to 15 digits, the first not 0 (got %d characters)",
			utf8.RuneCountInString(phone)))
	}
	sms.To = phone

	if sms.Template, err = requiredString(fields, "template"); err != nil {
		return SMS{}, err
	}
	if !validName(sms.Template, MaxTemplateLen) {
		return SMS{}, invalid("template", fmt.Errorf(
			"must be 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-' (got %d characters)",
			MaxTemplateLen, utf8.RuneCountInString(sms.Template)))
	}

	if sms.Params, err = decodeParams(fields["params"]); err != nil {
		return SMS{}, err
	}
	if sms.ExpiresAt, err = decodeTime(fields, "expires_at"); err != nil {
		return SMS{}, err
	}
	return sms, nil
}

// decodeTime decodes the optional RFC 3339 time of field name: the zero time when it is absent or
// null.
func decodeTime(fields map[string]json.RawMessage, name string) (time.Time, error) {
	raw, ok := fields[name]
	if !ok || kind(raw) == "null" {
		return time.Time{}, nil
	}
	var s string
	if kind(raw) != "string" || json.Unmarshal(raw, &s) != nil {
		return time.Time{}, invalid(name, fmt.Errorf("must be a string, got %s", kind(raw)))
	}
	t, err := rfc3339.Parse(s)
	if err != nil {
		return time.Time{}, invalid(name, errors.New("must be an RFC 3339 time with its zone, since 1970, such as 2026-01-02T15:04:05Z"))
	}
	return t, nil
}

// decodeParams decodes the optional params of an SMS: an object of at most MaxParams strings, each
// named as paramName says and at most MaxParamValueLen bytes long. Absent or null, it is empty.
func decodeParams(raw json.RawMessage) (map[string]string, error) {
	params := map[string]string{}
	if raw == nil || kind(raw) == "null" {
		return params, nil
	}
	if kind(raw) != "object" {
		return nil, invalid("params", fmt.Errorf("must be an object of strings, got %s", kind(raw)))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, invalid("params", errors.New("must be an object of strings"))
	}
	if _, ok := duplicateName(raw); ok {
		return nil, invalid("params", errors.New("has a param name more than once"))
	}
	if len(fields) > MaxParams {
		return nil, invalid("params", fmt.Errorf("at most %d params, got %d", MaxParams, len(fields)))
	}
	for name, value := range fields {
		if !paramName(name) {
			return nil, invalid("params", fmt.Errorf(
				"a param name must be 1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or '_'",
				MaxParamNameLen))
		}
		s, err := decodeParam(name, value)
		if err != nil {
			return nil, err
		}
		params[name] = s
	}
	return params, nil
}

// paramName reports whether name can name a param: a name of at most MaxParamNameLen characters (see
// validName) that starts with a letter or '_'.
func paramName(name string) bool {
	return validName(name, MaxParamNameLen) && !('0' <= name[0] && name[0] <= '9' || name[0] == '.' || name[0] == '-')
}

// decodeParam decodes the value of param name: a string of at most MaxParamValueLen bytes.
func decodeParam(name string, value json.RawMessage) (string, error) {
	field := fmt.Sprintf("params[%q]", name)
	if kind(value) != "string" {
		return "", invalid(field, fmt.Errorf("must be a string, got %s", kind(value)))
	}
	var s string
	if err := json.Unmarshal(value, &s); err != nil {
		return "", invalid(field, errors.New("must be a string"))
	}
	if len(s) > MaxParamValueLen {
		return "", invalid(field, fmt.Errorf("must be at most %d bytes, got %d", MaxParamValueLen, len(s)))
	}
	return s, nil
}

func requiredString(fields map[string]json.RawMessage, name string) (string, error) {
	raw, ok := fields[name]
	if !ok || kind(raw) == "null" {
		return "", invalid(name, errors.New("is required"))
	}
	if kind(raw) != "string" {
		return "", invalid(name, fmt.Errorf("must be a string, got %s", kind(raw)))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", invalid(name, errors.New("must be a string"))
	}
	return s, nil
}

// validName reports whether s is 1 to max characters of A–Z, a–z, 0–9, '_', '.', '-'.
func validName(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

// duplicateName returns a member name that the valid JSON object value holds more than once at its
// top level: any name, or only one of names when they are given.
func duplicateName(value []byte, names ...string) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(value))
	if _, err := dec.Token(); err != nil { // the '{'
		return "", false
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := t.(string)
		if len(names) == 0 || slices.Contains(names, name) {
			if seen[name] {
				return name, true
			}
			seen[name] = true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

// kind names the JSON type of a valid JSON value by its first byte.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

// notAnObject explains why value is not a JSON object without quoting it: encoding/json's own
// messages quote numbers and characters of the input.
func notAnObject(value []byte, err error) error {
	var syntaxErr *json.SyntaxError
	switch {
	case len(bytes.TrimSpace(value)) == 0:
		return errors.New("is empty")
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("is not valid JSON (error at byte %d)", syntaxErr.Offset)
	default:
		return fmt.Errorf("must be a JSON object, got %s", kind(value))
	}
}

func invalid(field string, err error) error {
	return inboxworker.Permanent(inboxworker.InvalidPayload, fmt.Errorf("sms event: %s %w", field, err))
}
