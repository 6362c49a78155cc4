package notify_test

import (
	"errors"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/fault"
	"github.com/inboxworker/inboxworker/internal/notify"
)

var decodeTests = []struct {
	name  string
	value string
	// want is the decoded SMS; wantField, when set, the field the error must name instead.
	want      notify.SMS
	wantField string
}{
	{name: "Full",
		value: `{"event_id":"e1","phone":"+8613800138000","template":"verify_code","params":{"code":"123456"}}`,
		want:  notify.SMS{To: "+8613800138000", Template: "verify_code", Params: map[string]string{"code": "123456"}}},
	{name: "NoEventIDNoParams", value: `{"phone":"+14155552671","template":"welcome"}`,
		want: notify.SMS{To: "+14155552671", Template: "welcome", Params: map[string]string{}}},
	{name: "NullParams", value: `{"phone":"+12345678","template":"t","params":null,"event_id":null}`,
		want: notify.SMS{To: "+12345678", Template: "t", Params: map[string]string{}}},
	{name: "ShortestPhone", value: `{"phone":"+12345678","template":"t"}`,
		want: notify.SMS{To: "+12345678", Template: "t", Params: map[string]string{}}},
	{name: "LongestPhone", value: `{"phone":"+123456789012345","template":"t"}`,
		want: notify.SMS{To: "+123456789012345", Template: "t", Params: map[string]string{}}},
	{name: "UnknownFieldIgnored", value: `{"phone":"+8613800138000","template":"SMS_1.a-b","sender":"x"}`,
		want: notify.SMS{To: "+8613800138000", Template: "SMS_1.a-b", Params: map[string]string{}}},
	{name: "EmptyParamValue", value: `{"phone":"+8613800138000","template":"t","params":{"_a.b-c":""}}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{"_a.b-c": ""}}},

	{name: "NamesAreCaseSensitive", value: `{"phone":"+8613800138000","PHONE":"+14155552671","Template":"x","template":"t"}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{}}},

	{name: "UnknownFieldTwice", value: `{"x":1,"phone":"+8613800138000","template":"t","x":2}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{}}},

	{name: "ExpiresAt", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02T15:04:05Z"}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{},
			ExpiresAt: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}},
	{name: "ExpiresAtOffsetFraction", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02T23:04:05.5+08:00"}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{},
			ExpiresAt: time.Date(2026, 1, 2, 15, 4, 5, 5e8, time.UTC)}},
	{name: "ExpiresAtLowercase", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02t15:04:05z"}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{},
			ExpiresAt: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}},
	{name: "ExpiresAtNull", value: `{"phone":"+8613800138000","template":"t","expires_at":null}`,
		want: notify.SMS{To: "+8613800138000", Template: "t", Params: map[string]string{}}},

	{name: "Empty", value: ``, wantField: "value"},
	{name: "ExpiresAtUnsetTime", value: `{"phone":"+8613800138000","template":"t","expires_at":"0001-01-01T00:00:00Z"}`, wantField: "expires_at"},
	{name: "ExpiresAtOffset24h", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02T15:04:05+24:00"}`, wantField: "expires_at"},
	{name: "ExpiresAtNumber", value: `{"phone":"+8613800138000","template":"t","expires_at":1767366245}`, wantField: "expires_at"},
	{name: "ExpiresAtDateOnly", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02"}`, wantField: "expires_at"},
	{name: "ExpiresAtNoZone", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-01-02T15:04:05"}`, wantField: "expires_at"},
	{name: "ExpiresAtWords", value: `{"phone":"+8613800138000","template":"t","expires_at":"in 5 minutes"}`, wantField: "expires_at"},
	{name: "ExpiresAtBadMonth", value: `{"phone":"+8613800138000","template":"t","expires_at":"2026-13-02T15:04:05Z"}`, wantField: "expires_at"},
	{name: "ExpiresAtEmpty", value: `{"phone":"+8613800138000","template":"t","expires_at":""}`, wantField: "expires_at"},
	{name: "ExpiresAtTwice", value: `{"expires_at":"2026-01-02T15:04:05Z","phone":"+8613800138000","template":"t","expires_at":"2036-01-02T15:04:05Z"}`,
		wantField: "expires_at"},
	{name: "PhoneOtherCaseOnly", value: `{"PHONE":"+8613800138000","template":"t"}`, wantField: "phone"},
	{name: "PhoneTwice", value: `{"phone":"+8613800138000","template":"t","phone":"+14155552671"}`, wantField: "phone"},
	{name: "TemplateTwice", value: `{"template":"a","phone":"+8613800138000","template":"b"}`, wantField: "template"},
	{name: "ParamTwice", value: `{"phone":"+8613800138000","template":"t","params":{"code":"1","code":"2"}}`,
		wantField: "params"},
	{name: "NotJSON", value: `phone=+8613800138000`, wantField: "value"},
	{name: "Truncated", value: `{"phone":"+8613800138000"`, wantField: "value"},
	{name: "Array", value: `["+8613800138000"]`, wantField: "value"},
	{name: "Number", value: `8613800138000`, wantField: "value"},
	{name: "Null", value: `null`, wantField: "value"},
	{name: "TrailingGarbage", value: `{"phone":"+8613800138000","template":"t"} x`, wantField: "value"},
	{name: "EventIDNumber", value: `{"event_id":8613800138000,"phone":"+8613800138000","template":"t"}`, wantField: "event_id"},
	{name: "PhoneMissing", value: `{"template":"t"}`, wantField: "phone"},
	{name: "PhoneNull", value: `{"phone":null,"template":"t"}`, wantField: "phone"},
	{name: "PhoneNumber", value: `{"phone":8613800138000,"template":"t"}`, wantField: "phone"},
	{name: "PhoneNoPlus", value: `{"phone":"8613800138000","template":"t"}`, wantField: "phone"},
	{name: "PhoneLeadingZero", value: `{"phone":"+0613800138000","template":"t"}`, wantField: "phone"},
	{name: "PhoneTooShort", value: `{"phone":"+1234567","template":"t"}`, wantField: "phone"},
	{name: "PhoneTooLong", value: `{"phone":"+1234567890123456","template":"t"}`, wantField: "phone"},
	{name: "PhoneSpaces", value: `{"phone":"+86 138 0013 8000","template":"t"}`, wantField: "phone"},
	{name: "PhoneTrailingNewline", value: `{"phone":"+8613800138000\n","template":"t"}`, wantField: "phone"},
	{name: "PhoneFullwidthDigits", value: `{"phone":"+８６13800138000","template":"t"}`, wantField: "phone"},
	{name: "TemplateMissing", value: `{"phone":"+8613800138000"}`, wantField: "template"},
	{name: "TemplateEmpty", value: `{"phone":"+8613800138000","template":""}`, wantField: "template"},
	{name: "TemplateObject", value: `{"phone":"+8613800138000","template":{}}`, wantField: "template"},
	{name: "TemplateSpace", value: `{"phone":"+8613800138000","template":"verify code"}`, wantField: "template"},
	{name: "TemplateTooLong", value: `{"phone":"+8613800138000","template":"` + strings.Repeat("t", 101) + `"}`,
		wantField: "template"},
	{name: "ParamsArray", value: `{"phone":"+8613800138000","template":"t","params":["a"]}`, wantField: "params"},
	{name: "ParamsString", value: `{"phone":"+8613800138000","template":"t","params":"code=1"}`, wantField: "params"},
	{name: "ParamNumber", value: `{"phone":"+8613800138000","template":"t","params":{"code":123456}}`,
		wantField: `params["code"]`},
	{name: "ParamNull", value: `{"phone":"+8613800138000","template":"t","params":{"code":null}}`,
		wantField: `params["code"]`},
	{name: "ParamObject", value: `{"phone":"+8613800138000","template":"t","params":{"code":{"v":"1"}}}`,
		wantField: `params["code"]`},
	{name: "ParamBool", value: `{"phone":"+8613800138000","template":"t","params":{"ok":true}}`,
		wantField: `params["ok"]`},
	{name: "ParamNameEmpty", value: `{"phone":"+8613800138000","template":"t","params":{"":"x"}}`, wantField: "params"},
	{name: "ParamNameDigits", value: `{"phone":"+8613800138000","template":"t","params":{"8613800138000":"x"}}`,
		wantField: "params"},
	{name: "ParamValueTooLong",
		value:     `{"phone":"+8613800138000","template":"t","params":{"a":"` + strings.Repeat("x", 1001) + `"}}`,
		wantField: `params["a"]`},
	{name: "TooManyParams", value: `{"phone":"+8613800138000","template":"t","params":{` + manyParams(33) + `}}`,
		wantField: "params"},
}

func manyParams(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"p` + strings.Repeat("x", i) + `":"v"`)
	}
	return b.String()
}

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, tt := range decodeTests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := notify.Decode([]byte(tt.value))
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				if got.Key != tt.want.Key || got.To != tt.want.To || got.Template != tt.want.Template ||
					!maps.Equal(got.Params, tt.want.Params) || got.Params == nil || !got.ExpiresAt.Equal(tt.want.ExpiresAt) {
					t.Fatalf("Decode = %+v, want %+v", got, tt.want)
				}
				return
			}
			checkDecodeError(t, []byte(tt.value), err)
			if !strings.Contains(err.Error(), "sms event: "+tt.wantField+" ") {
				t.Fatalf("error %q does not name field %s", err, tt.wantField)
			}
		})
	}
}

// longDigits finds what could be a whole phone number.
var longDigits = regexp.MustCompile(`\d{7,}`)

// checkDecodeError fails unless err is a permanent invalid_payload error that quotes no number.
func checkDecodeError(t *testing.T, value []byte, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("Decode(%q) succeeded, want an error", value)
	}
	var fe *fault.Error
	if kind, reason, _ := fault.Classify(err); !errors.As(err, &fe) || kind != fault.KindPermanent ||
		reason != inboxtype.InvalidPayload {
		t.Fatalf("Decode(%q) error %v classified %v %q, want permanent %q", value, err, kind, reason,
			inboxtype.InvalidPayload)
	}
	if longDigits.MatchString(err.Error()) {
		t.Fatalf("Decode(%q) error %q quotes a number", value, err)
	}
}

var (
	e164     = regexp.MustCompile(`^\+[1-9][0-9]{7,14}$`)
	template = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,100}$`)
	param    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`)
)

func FuzzDecode(f *testing.F) {
	for _, tt := range decodeTests {
		f.Add([]byte(tt.value))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		sms, err := notify.Decode(value)
		if err != nil {
			checkDecodeError(t, value, err)
			return
		}
		if sms.Key != "" || !e164.MatchString(sms.To) || !template.MatchString(sms.Template) ||
			sms.Params == nil || len(sms.Params) > notify.MaxParams {
			t.Fatalf("Decode(%q) = %+v, not a valid SMS", value, sms)
		}
		for name, v := range sms.Params {
			if !param.MatchString(name) || len(v) > notify.MaxParamValueLen {
				t.Fatalf("Decode(%q): invalid param %q: %q", value, name, v)
			}
		}
	})
}

func TestMaskPhone(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ phone, want string }{
		{"+8613800138000", "+86138****8000"},
		{"+14155552671", "+1415****671"},
		{"+447911123456", "+4479****3456"},
		{"+123456789012345", "+12345****2345"},
		{"+12345678", "+12****78"},
		{"+123456789", "+123****89"},
		{"", "****"},
		{"8613800138000", "****"},
		{"+86 138 0013 8000", "****"},
		{"+1234567", "****"},
	} {
		t.Run(strings.TrimPrefix(tt.phone, "+"), func(t *testing.T) {
			t.Parallel()
			if got := notify.MaskPhone(tt.phone); got != tt.want {
				t.Fatalf("MaskPhone(%q) = %q, want %q", tt.phone, got, tt.want)
			}
		})
	}
}

// TestMaskPhoneHides checks every valid length: at least four digits hidden, at most nine shown.
func TestMaskPhoneHides(t *testing.T) {
	t.Parallel()
	const digits = "987654321098765"
	for n := 8; n <= 15; n++ {
		phone := "+" + digits[:n]
		masked := notify.MaskPhone(phone)
		shown := strings.Count(masked, "") - 1 - len("+****")
		if !strings.HasPrefix(masked, "+") || strings.Count(masked, "*") != 4 || shown > 9 || n-shown < 4 ||
			strings.Contains(masked, digits[:n]) {
			t.Errorf("MaskPhone(%q) = %q: shows %d of %d digits", phone, masked, shown, n)
		}
	}
}
