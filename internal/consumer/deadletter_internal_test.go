package consumer

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestRefused checks which dead-letter write errors are permanent (the dead letter is kept in
// Postgres) and which are waited for, by kafka-go's error code, however kafka-go wraps it.
func TestRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"LocalLimit", kafka.MessageTooLargeError{}, true},
		{"BrokerTooLarge", kafka.WriteErrors{fmt.Errorf("%w: The message is too large.", kafka.MessageSizeTooLarge)}, true},
		{"RecordListTooLarge", kafka.WriteErrors{kafka.RecordListTooLarge}, true},
		{"InvalidRecord", kafka.WriteErrors{kafka.InvalidRecord}, true},
		{"InvalidTopic", kafka.InvalidTopic, true},
		{"TopicNotAuthorized", kafka.WriteErrors{kafka.TopicAuthorizationFailed}, true},
		{"ClusterNotAuthorized", fmt.Errorf("metadata: %w", kafka.ClusterAuthorizationFailed), true},
		{"LeaderNotAvailable", kafka.WriteErrors{kafka.LeaderNotAvailable}, false},
		{"NotEnoughReplicas", kafka.WriteErrors{kafka.NotEnoughReplicas}, false},
		{"UnknownTopic", kafka.WriteErrors{kafka.UnknownTopicOrPartition}, false},
		{"ConnectionRefused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, false},
		{"ConnectionLost", kafka.WriteErrors{io.ErrUnexpectedEOF}, false},
		{"TextSaysTooLarge", errors.New("[10] Message Size Too Large"), false}, // never by text
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := refused(tt.err); got != tt.want {
				t.Errorf("refused(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
