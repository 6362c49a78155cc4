package notify_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/notify"
)

var validityTests = []struct {
	value string
	want  notify.Validity
	// wantErr, when set, is a part of the error.
	wantErr string
}{
	{value: "", want: nil},
	{value: "  ", want: nil},
	{value: "verify_code=5m", want: notify.Validity{"verify_code": 5 * time.Minute}},
	{value: "verify_code=5m,login_code=2m", want: notify.Validity{"verify_code": 5 * time.Minute, "login_code": 2 * time.Minute}},
	{value: " verify_code = 5m , SMS_1.a-b=1h30m ", want: notify.Validity{"verify_code": 5 * time.Minute, "SMS_1.a-b": 90 * time.Minute}},
	{value: "t=1s", want: notify.Validity{"t": time.Second}},
	{value: "t=168h", want: notify.Validity{"t": 7 * 24 * time.Hour}},

	{value: "t=999ms", wantErr: `t: must be from 1s to 168h, got "999ms"`},
	{value: "t=168h1s", wantErr: `t: must be from 1s to 168h, got "168h1s"`},
	{value: "t=0", wantErr: "must be from"},
	{value: "t=-5m", wantErr: "must be from"},
	{value: "t=5", wantErr: `t: invalid duration "5"`},
	{value: "t=5d", wantErr: `t: invalid duration "5d"`},
	{value: "t=", wantErr: `want TEMPLATE=VALUE, got "t="`},
	{value: "t", wantErr: `want TEMPLATE=VALUE, got "t"`},
	{value: "=5m", wantErr: `"" is not a template name`},
	{value: "verify code=5m", wantErr: `"verify code" is not a template name`},
	{value: "t=5m,", wantErr: "an empty entry"},
	{value: ",t=5m", wantErr: "an empty entry"},
	{value: "t=5m,t=2m", wantErr: "t is given twice"},
	{value: "t=5m;2m", wantErr: `t: invalid duration "5m;2m"`},
	{value: "t=1/1m", wantErr: `t: invalid duration "1/1m"`},
}

func TestParseValidity(t *testing.T) {
	t.Parallel()
	for _, tt := range validityTests {
		t.Run(tt.value, func(t *testing.T) {
			t.Parallel()
			got, err := notify.ParseValidity(tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseValidity(%q) = %v, %v; want an error with %q", tt.value, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseValidity(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
		})
	}
}

var limitTests = []struct {
	value   string
	want    notify.RecipientLimits
	wantErr string
}{
	{value: "", want: nil},
	{value: "verify_code=1/1m", want: notify.RecipientLimits{"verify_code": {{1, time.Minute}}}},
	{value: "verify_code=1/1m;5/1h;10/24h", want: notify.RecipientLimits{
		"verify_code": {{1, time.Minute}, {5, time.Hour}, {10, 24 * time.Hour}}}},
	{value: "verify_code=10/24h;1/1m;5/1h,login_code=3/10m", want: notify.RecipientLimits{
		"verify_code": {{1, time.Minute}, {5, time.Hour}, {10, 24 * time.Hour}}, "login_code": {{3, 10 * time.Minute}}}},
	{value: " t = 1 / 1s ; 10000/720h ", want: notify.RecipientLimits{"t": {{1, time.Second}, {10000, 720 * time.Hour}}}},

	{value: "t=0/1m", wantErr: `t: a count must be from 1 to 10000, got "0"`},
	{value: "t=10001/1m", wantErr: `t: a count must be from 1 to 10000, got "10001"`},
	{value: "t=-1/1m", wantErr: "a count must be from 1"},
	{value: "t=+1/1m", wantErr: "a count must be from 1"},
	{value: "t=x/1m", wantErr: "a count must be from 1"},
	{value: "t=1/999ms", wantErr: `t: a period must be from 1s to 720h, got "999ms"`},
	{value: "t=1/720h1s", wantErr: `a period must be from 1s to 720h, got "720h1s"`},
	{value: "t=1/1d", wantErr: `t: invalid period "1d"`},
	{value: "t=1/", wantErr: `t: invalid period ""`},
	{value: "t=1", wantErr: `t: want COUNT/PERIOD (1/1m), got "1"`},
	{value: "t=1m", wantErr: "want COUNT/PERIOD"},
	{value: "t=1/1m;", wantErr: `want COUNT/PERIOD (1/1m), got ""`},
	{value: "t=1/1m;2/60s", wantErr: "t: two windows of 1m"},
	{value: "t=1/1s;1/2s;1/3s;1/4s;1/5s;1/6s;1/7s;1/8s;1/9s", wantErr: "t: at most 8 windows, got 9"},
	{value: "verify_code=1/1m;5/30s", wantErr: "verify_code: 5/30s never binds: 1/1m allows fewer"},
	{value: "t=5/1m;5/1h", wantErr: "t: 5/1m never binds: 5/1h allows fewer"},
	{value: "t=1/1m,t=2/1h", wantErr: "t is given twice"},
	{value: "t=1/1m,,u=1/1m", wantErr: "an empty entry"},
	{value: "t 1/1m", wantErr: "want TEMPLATE=VALUE"},
	{value: "t/x=1/1m", wantErr: "is not a template name"},
}

func TestParseRecipientLimits(t *testing.T) {
	t.Parallel()
	for _, tt := range limitTests {
		t.Run(tt.value, func(t *testing.T) {
			t.Parallel()
			got, err := notify.ParseRecipientLimits(tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseRecipientLimits(%q) = %v, %v; want an error with %q", tt.value, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseRecipientLimits(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
		})
	}
}

func TestTooManyTemplates(t *testing.T) {
	t.Parallel()
	var validity, limits []string
	for i := range notify.MaxLimitedTemplates + 1 {
		validity = append(validity, fmt.Sprintf("t%d=1m", i))
		limits = append(limits, fmt.Sprintf("t%d=1/1m", i))
	}
	if _, err := notify.ParseValidity(strings.Join(validity, ",")); err == nil || !strings.Contains(err.Error(), "at most 1000 templates") {
		t.Errorf("ParseValidity of 1001 templates: %v, want at most 1000", err)
	}
	if _, err := notify.ParseRecipientLimits(strings.Join(limits, ",")); err == nil || !strings.Contains(err.Error(), "at most 1000 templates") {
		t.Errorf("ParseRecipientLimits of 1001 templates: %v, want at most 1000", err)
	}
	if _, err := notify.ParseRecipientLimits(strings.Join(limits[:1000], ",")); err != nil {
		t.Errorf("ParseRecipientLimits of 1000 templates: %v", err)
	}
}

// FuzzParseRecipientLimits checks that whatever the parser accepts is within its bounds, and reads
// back the same from its String; the seeds are the table's. FuzzParseValidity does the same for
// validities.
func FuzzParseRecipientLimits(f *testing.F) {
	for _, tt := range limitTests {
		f.Add(tt.value)
	}
	f.Fuzz(func(t *testing.T, value string) {
		l, err := notify.ParseRecipientLimits(value)
		if err != nil {
			return
		}
		for template, windows := range l {
			if len(windows) == 0 || len(windows) > notify.MaxWindows {
				t.Fatalf("%q: %s has %d windows", value, template, len(windows))
			}
			for i, w := range windows {
				if w.Count < 1 || w.Count > notify.MaxWindowCount || w.Period < notify.MinWindow ||
					w.Period > notify.MaxWindow || i > 0 && w.Period <= windows[i-1].Period {
					t.Fatalf("%q: %s's windows %v out of bounds or order", value, template, windows)
				}
			}
		}
		again, err := notify.ParseRecipientLimits(l.String())
		if err != nil || !reflect.DeepEqual(again, l) {
			t.Fatalf("%q: parsed %v, written %q, read back %v, %v", value, l, l.String(), again, err)
		}
	})
}

func FuzzParseValidity(f *testing.F) {
	for _, tt := range validityTests {
		f.Add(tt.value)
	}
	f.Fuzz(func(t *testing.T, value string) {
		v, err := notify.ParseValidity(value)
		if err != nil {
			return
		}
		for template, d := range v {
			if d < notify.MinValidity || d > notify.MaxValidity {
				t.Fatalf("%q: %s's validity %s out of bounds", value, template, d)
			}
		}
		again, err := notify.ParseValidity(v.String())
		if err != nil || !reflect.DeepEqual(again, v) {
			t.Fatalf("%q: parsed %v, written %q, read back %v, %v", value, v, v.String(), again, err)
		}
	})
}
