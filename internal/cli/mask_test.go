package cli

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
)

// TestStartupLogMasksEveryURL: every URL-valued setting (kind url) is masked in the startup line,
// password and query values.
func TestStartupLogMasksEveryURL(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	var urls []string
	for _, s := range settingsOf(bundledRoutes) {
		switch {
		case s.Env == "" || s.Meta != "URL":
			continue
		case strings.HasPrefix(s.Default, "postgres"):
			env[s.Env] = "postgres://app:pw-s3cret@db/shop?sslmode=disable&sslpassword=q-s3cret"
		default:
			env[s.Env] = "https://gw:pw-s3cret@sms.example/send?api_key=q-s3cret"
		}
		urls = append(urls, s.Env)
	}
	if len(urls) < 2 {
		t.Fatalf("URL settings %v: want DATABASE_URL and SMS_PROVIDER_URL at least", urls)
	}
	cfg := parseConfig(t, env, "run")
	cfg.Use(findCommand("run").selected(settingsOf(bundledRoutes)))
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
