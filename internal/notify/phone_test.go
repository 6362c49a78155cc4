package notify_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/inboxworker/inboxworker/internal/notify"
)

// digitRun finds 7 or more decimal digits of any script joined by anything but letters and digits:
// what could still be read as a phone number.
var digitRun = regexp.MustCompile(`\p{Nd}(?:[^\p{L}\p{Nd}]*\p{Nd}){6,}`)

var numberAnswers = []struct{ name, answer string }{
	{"E164", `+8613800138000 is blocked`},
	{"National", `138 0013 8000 is blocked`},
	{"DoubleSpaces", `861  3800  130018 is blocked`},
	{"ManySpaces", "861      3800\t\t130018"},
	{"Dashes", `+86-138-0013-8000`},
	{"Dots", `138.0013.8000`},
	{"Parentheses", `(+86) (138) 0013 8000`},
	{"Slashes", `86/138/0013/8000`},
	{"NoBreakSpaces", "138\u00a00013\u00a08000"},
	{"ThinSpaces", "138\u20090013\u20098000"},
	{"ZeroWidthSpaces", "1\u200b3\u200b8\u200b0\u200b0\u200b1\u200b3\u200b8\u200b0\u200b0\u200b0"},
	{"FullwidthDigits", `８６１３８００１３８０００ is blocked`},
	{"FullwidthMixed", `+８６ 138 ００１３ 8000`},
	{"ArabicIndicDigits", `٨٦١٣٨٠٠١٣٨٠٠٠`},
	{"DevanagariDigits", `८६१३८००१३८०००`},
	{"InJSON", `{"error":"invalid recipient","to":"8613800138000"}`},
	{"EscapedInJSON", `{"to":"\u002b8613800138000"}`},
}

func TestMaskNumbers(t *testing.T) {
	t.Parallel()
	for _, tt := range numberAnswers {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := notify.MaskNumbers(tt.answer)
			if digitRun.MatchString(got) || !strings.Contains(got, "[number]") {
				t.Fatalf("MaskNumbers(%q) = %q, want every run of digits masked", tt.answer, got)
			}
		})
	}
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"error 4001: template 12 not approved", "error 4001: template 12 not approved"},
		{"code 123456", "code 123456"},
		{"+8613800138000 is blocked", "+[number] is blocked"},
		{"call 861  3800  130018 now", "call [number] now"},
		{"id abc1234567def", "id abc[number]def"},
		{"a1b2c3d4e5f6g7", "a1b2c3d4e5f6g7"},
	} {
		if got := notify.MaskNumbers(tt.in); got != tt.want {
			t.Errorf("MaskNumbers(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestHTTPSenderMasksEveryNumber: a rejected request's answer reaches dlq-error; whatever form the
// provider echoes the number in, it is masked there.
func TestHTTPSenderMasksEveryNumber(t *testing.T) {
	t.Parallel()
	for _, tt := range numberAnswers {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sender := newProvider(t, notify.HTTPConfig{}, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusUnprocessableEntity)
				_, _ = io.WriteString(w, tt.answer)
			})
			_, err := sender.Send(context.Background(), testSMS)
			if err == nil {
				t.Fatal("Send succeeded, want a rejection")
			}
			// The recipient itself is shown as MaskPhone shows it, four of its digits hidden.
			text := strings.TrimPrefix(err.Error(), "sms provider: 422 Unprocessable Entity")
			if text = strings.ReplaceAll(text, notify.MaskPhone(testPhone), "[recipient]"); digitRun.MatchString(text) {
				t.Fatalf("error %q holds a number", err)
			}
		})
	}
}

func FuzzMaskNumbers(f *testing.F) {
	for _, tt := range numberAnswers {
		f.Add(tt.answer)
	}
	f.Add("a1b2c3d4e5f6g7")
	f.Add("1 2 3 4 5 6 7 8 9 0")
	f.Fuzz(func(t *testing.T, text string) {
		got := notify.MaskNumbers(text)
		if m := digitRun.FindString(got); m != "" {
			t.Fatalf("MaskNumbers(%q) = %q: %q survives", text, got, m)
		}
	})
}
