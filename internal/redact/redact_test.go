package redact

import "testing"

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
