package cli

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestMaskURLQueryValues: a URL setting may carry a secret in any query value (an SMS gateway's
// api_key, a signature); only the values known to be harmless connection parameters are shown.
func TestMaskURLQueryValues(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"https://sms.example/send?api_key=K3Y", "https://sms.example/send?api_key=xxxxx"},
		{"https://sms.example/send?api_key=K3Y&sig=abc&v=2", "https://sms.example/send?api_key=xxxxx&sig=xxxxx&v=xxxxx"},
		{"https://u:pw@sms.example/send?token=K3Y", "https://u:xxxxx@sms.example/send?token=xxxxx"},
		{"https://sms.example/send?K3Y", "https://sms.example/send?xxxxx"},
		{"https://sms.example:bad/send?api_key=K3Y&b=K3Y", "https://sms.example:bad/send?api_key=xxxxx&b=xxxxx"},
		{"postgres://app@db/shop?sslmode=verify-full&application_name=worker&sslpassword=K3Y&options=K3Y",
			"postgres://app@db/shop?application_name=worker&options=xxxxx&sslmode=verify-full&sslpassword=xxxxx"},
		{"postgres://db/shop?user=app&password=K3Y", "postgres://db/shop?password=xxxxx&user=app"},
		{"postgres://app:K3Y@db:5432/shop?sslmode=require", "postgres://app:xxxxx@db:5432/shop?sslmode=require"},
	} {
		got := maskURL(tt.in)
		if got != tt.want {
			t.Errorf("maskURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.Contains(got, "K3Y") {
			t.Errorf("maskURL(%q) = %q: the secret is there", tt.in, got)
		}
	}
}

// TestStartupLogMasksEveryURL: every URL-valued setting (meta "URL") is masked in the startup line,
// password and query values.
func TestStartupLogMasksEveryURL(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	var urls []string
	for _, s := range settings {
		switch {
		case s.envless || s.meta != "URL":
			continue
		case strings.HasPrefix(s.def, "postgres"):
			env[s.env] = "postgres://app:pw-s3cret@db/shop?sslmode=disable&sslpassword=q-s3cret"
		default:
			env[s.env] = "https://gw:pw-s3cret@sms.example/send?api_key=q-s3cret"
		}
		urls = append(urls, s.env)
	}
	if len(urls) < 2 {
		t.Fatalf("URL settings %v: want DATABASE_URL and SMS_PROVIDER_URL at least", urls)
	}
	cfg := parseConfig(t, env, "run")
	cfg.used = findCommand("run").selected()
	var out bytes.Buffer
	logStart(context.Background(), slog.New(slog.NewJSONHandler(&out, nil)), "run", cfg)
	if strings.Contains(out.String(), "s3cret") {
		t.Errorf("a secret of %v leaked into the startup line: %s", urls, out.String())
	}
	for _, want := range []string{`"SMS_PROVIDER_URL":"https://gw:xxxxx@sms.example/send?api_key=xxxxx"`,
		`"DATABASE_URL":"postgres://app:xxxxx@db/shop?sslmode=disable&sslpassword=xxxxx"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the startup line lacks %s: %s", want, out.String())
		}
	}
}
