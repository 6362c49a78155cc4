package startup

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go/sasl/plain"
)

func TestKafkaAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		mechanism string
		tls       bool
		wantName  string
	}{
		{"", false, ""},
		{"PLAIN", true, "PLAIN"},
		{"SCRAM-SHA-256", false, "SCRAM-SHA-256"},
		{"SCRAM-SHA-512", true, "SCRAM-SHA-512"},
	}
	for _, tt := range tests {
		k := Kafka{SASLMechanism: tt.mechanism, Username: "u", Password: "p", TLS: tt.tls}
		mechanism, tlsConfig, err := k.Auth()
		if err != nil {
			t.Fatalf("%s: %v", tt.mechanism, err)
		}
		name := ""
		if mechanism != nil {
			name = mechanism.Name()
		}
		if name != tt.wantName || (tlsConfig != nil) != tt.tls {
			t.Errorf("%q: got mechanism %q and TLS %v", tt.mechanism, name, tlsConfig != nil)
		}
		if p, ok := mechanism.(plain.Mechanism); ok && (p.Username != "u" || p.Password != "p") {
			t.Errorf("PLAIN credentials not passed: %+v", p)
		}
	}
}

func TestCheckTopicName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"payments.callbacks": true, ".dlq": true, "a_b-C.9": true, strings.Repeat("t", MaxTopicName): true,
		"": false, ".": false, "..": false, "bad topic!": false, "a/b": false, strings.Repeat("t", MaxTopicName+1): false,
	} {
		if err := CheckTopicName(name); (err == nil) != ok {
			t.Errorf("CheckTopicName(%.20q) = %v, want ok %v", name, err, ok)
		}
	}
}
