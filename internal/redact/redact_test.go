package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/shop?sslmode=require", "postgres://app:xxxxx@db:5432/shop?sslmode=require"},
		{"postgres://app@db/shop", "postgres://app@db/shop"},
		{"postgres://db/shop?user=app&password=s3cret", "postgres://db/shop?password=xxxxx&user=app"},
		{"postgres://app:s3cret@db:bad/shop", "postgres://app:xxxxx@db:bad/shop"},
		{"postgres://app:s%3cret@db/shop", "postgres://app:xxxxx@db/shop"},
		{"host=db user=app password=s3cret dbname=shop", "host=db user=app password=xxxxx dbname=shop"},
		{"host=db password='s3 cret' dbname=shop", "host=db password=xxxxx dbname=shop"},
		{"https://sms.example/send", "https://sms.example/send"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestURLQueryValues: a URL setting may carry a secret in any query value (an SMS gateway's
// api_key, a signature); only the values known to be harmless connection parameters are shown.
func TestURLQueryValues(t *testing.T) {
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
		got := URL(tt.in)
		if got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if strings.Contains(got, "K3Y") {
			t.Errorf("URL(%q) = %q: the secret is there", tt.in, got)
		}
	}
}
