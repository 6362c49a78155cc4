// Package devbroker is the embedded Kafka broker of worker dev and worker demo: one broker in
// memory that speaks the real wire protocol (kfake), with the worker's topics and their dead-letter
// topics created, Partitions each, in Kafka's default configuration.
//
// It is for people trying the worker and for its demo, never for production: its messages go when
// the process stops. It does not run the worker nor produce.
package devbroker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Partitions is how many partitions each topic of the embedded broker has.
const Partitions = 3

// Broker is a running embedded broker. Close it when done.
type Broker struct {
	*kfake.Cluster
	// Addr is the address it listens on: the one asked for, with the port bound for port 0.
	Addr string
}

// Start starts a one-broker in-memory cluster on addr with topics and their dead-letter topics
// (topic + dlqSuffix) created. An address it cannot listen on is an error naming DEV_KAFKA_ADDR.
func Start(ctx context.Context, addr string, topics []string, dlqSuffix string, logger *slog.Logger) (_ *Broker, err error) {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
		kfake.GroupMinSessionTimeout(time.Second),
		kfake.WithLogger(kfakeLogger{logger}),
	)
	if err != nil {
		return nil, fmt.Errorf("DEV_KAFKA_ADDR: start the embedded broker: %w", err)
	}
	b := &Broker{Cluster: c, Addr: c.ListenAddrs()[0]}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err = answerVersionsAsKafka4(ctx, c, b.Addr); err != nil {
		return nil, fmt.Errorf("start the embedded broker: %w", err)
	}

	if err = CreateTopics(ctx, b.Addr, topics, dlqSuffix); err != nil {
		return nil, fmt.Errorf("create the topics of the embedded broker: %w", err)
	}
	logger.Info("embedded Kafka broker listening", slog.String("addr", b.Addr))
	return b, nil
}

// CreateTopics creates topics and their dead-letter topics (topic + dlqSuffix), Partitions each, on
// the broker at addr, as Start does on the embedded broker.
func CreateTopics(ctx context.Context, addr string, topics []string, dlqSuffix string) error {
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		for _, name := range []string{t, t + dlqSuffix} {
			req.Topics = append(req.Topics, kafka.TopicConfig{Topic: name, NumPartitions: Partitions, ReplicationFactor: 1})
		}
	}
	client, closeClient := Client(addr)
	defer closeClient()
	resp, err := client.CreateTopics(ctx, req)
	if err == nil {
		for _, e := range resp.Errors {
			err = cmp.Or(err, e)
		}
	}
	return err
}

// Client is a kafka-go client of the broker at addr. Call the returned function when done.
func Client(addr string) (*kafka.Client, func()) {
	transport := &kafka.Transport{ClientID: "inboxworker-dev"}
	return &kafka.Client{Addr: kafka.TCP(addr), Transport: transport, Timeout: 10 * time.Second},
		transport.CloseIdleConnections
}

// kfakeLogger routes the embedded broker's logs to logger at debug and below.
type kfakeLogger struct{ logger *slog.Logger }

func (l kfakeLogger) Logf(level kfake.LogLevel, format string, args ...any) {
	lvl := slog.LevelDebug
	if level == kfake.LogLevelError {
		lvl = slog.LevelWarn
	}
	ctx := context.Background()
	if !l.logger.Enabled(ctx, lvl) {
		return
	}
	l.logger.LogAttrs(ctx, lvl, "broker: "+fmt.Sprintf(format, args...), slog.String("component", "kfake"))
}

// answerVersionsAsKafka4 makes c answer ApiVersions as a Kafka 4.x broker does: kfake lists Produce
// from v3, the first version Kafka 4 serves, but Kafka 4 lists it from v0 (KAFKA-18659), because
// librdkafka reads a Produce floor above 2 as a broker without the v2 record format and sends gzip,
// snappy and lz4 uncompressed to it (librdkafka#4956). So that kcat and every librdkafka producer
// against worker dev send what they send to production, c's own answer, read once here, is given
// with Produce from v0, at the version each request asks (or, above the broker's, KIP-511's
// UNSUPPORTED_VERSION with ApiVersions' own range).
func answerVersionsAsKafka4(ctx context.Context, c *kfake.Cluster, addr string) error {
	client, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ClientID("inboxworker-dev"))
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kresp, err := client.Request(ctx, kmsg.NewPtrApiVersionsRequest())
	if err != nil {
		return fmt.Errorf("read its ApiVersions: %w", err)
	}
	own := kresp.(*kmsg.ApiVersionsResponse)
	var versions kmsg.ApiVersionsResponseApiKey
	for i, k := range own.ApiKeys {
		switch k.ApiKey {
		case 0: // Produce
			own.ApiKeys[i].MinVersion = 0
		case 18: // ApiVersions
			versions = k
		}
	}
	c.ControlKey(18, func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := *own
		resp.ApiKeys = slices.Clone(own.ApiKeys)
		if v := kreq.GetVersion(); v > versions.MaxVersion {
			resp = kmsg.ApiVersionsResponse{ErrorCode: kerr.UnsupportedVersion.Code, ApiKeys: []kmsg.ApiVersionsResponseApiKey{versions}}
		} else {
			resp.SetVersion(v)
		}
		return &resp, nil, true
	})
	return nil
}
