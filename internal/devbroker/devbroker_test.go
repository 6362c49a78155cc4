package devbroker_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/inboxworker/inboxworker/internal/devbroker"
)

// TestVersionsAsKafka4: the embedded broker lists Produce from v0, as Kafka 4.x does, so that
// librdkafka (kcat) compresses what it sends to it, and the rest as kfake serves it.
func TestVersionsAsKafka4(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := devbroker.Start(ctx, "127.0.0.1:0", []string{"t"}, ".dlq", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(b.Addr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	req := kmsg.NewPtrApiVersionsRequest()
	req.ClientSoftwareName, req.ClientSoftwareVersion = "devbroker-test", "1"
	kresp, err := client.Broker(0).RetriableRequest(ctx, req)
	if err != nil {
		t.Fatalf("ApiVersions: %v", err)
	}
	resp := kresp.(*kmsg.ApiVersionsResponse)
	produce, fetch := -1, -1
	for _, k := range resp.ApiKeys {
		switch k.ApiKey {
		case 0:
			produce = int(k.MinVersion)
		case 1:
			fetch = int(k.MaxVersion)
		}
	}
	if resp.ErrorCode != 0 || produce != 0 || fetch < 13 {
		t.Errorf("ApiVersions: error %d, Produce from %d, Fetch to %d; want 0, Produce from 0, Fetch to 13 or more",
			resp.ErrorCode, produce, fetch)
	}
}
