package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// devPartitions is how many partitions each topic of the embedded broker has.
const devPartitions = 3

// devCommand is `worker dev`.
func devCommand(ctx context.Context, a *app, cfg *Config, _ []string) error {
	if !cfg.explicit["LOG_FORMAT"] {
		cfg.LogFormat = "text" // worker dev is watched by a person, as the demo is
	}
	logger := newLogger(cfg, a.stderr)
	broker, err := startDevBroker(ctx, cfg, cfg.DevKafkaAddr, logger)
	if err != nil {
		return err
	}
	defer broker.Close()
	cfg.KafkaBrokers = []string{broker.addr}
	broker.printHowTo(a.stdout, cfg)

	logStart(ctx, logger, "dev", cfg)
	w, err := newWorker(ctx, cfg, logger, workerOptions{migrate: true, serveHTTP: true})
	if err != nil {
		return err
	}
	return w.run(ctx)
}

// devBroker is the embedded Kafka broker of `worker dev` and `worker demo`.
type devBroker struct {
	*kfake.Cluster
	addr string
}

// startDevBroker starts a one-broker in-memory cluster on addr with the topics and their dead-letter
// topics created, with Kafka's default configuration: the inbox retentions, unless set, follow the
// topics' (see settleRetention), as they do against a real cluster.
func startDevBroker(ctx context.Context, cfg *Config, addr string, logger *slog.Logger) (_ *devBroker, err error) {
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) { return net.Listen(network, addr) }),
		kfake.GroupMinSessionTimeout(time.Second),
		kfake.WithLogger(kfakeLogger{logger}),
	)
	if err != nil {
		return nil, &settingError{name: "DEV_KAFKA_ADDR", err: fmt.Errorf("start the embedded broker: %w", err)}
	}
	b := &devBroker{Cluster: c, addr: c.ListenAddrs()[0]}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()

	req := &kafka.CreateTopicsRequest{}
	for _, t := range []string{cfg.TopicPayments, cfg.TopicSMS} {
		for _, name := range []string{t, t + cfg.DLQSuffix} {
			req.Topics = append(req.Topics, kafka.TopicConfig{Topic: name, NumPartitions: devPartitions, ReplicationFactor: 1})
		}
	}
	client, closeClient := localClient(b.addr)
	defer closeClient()
	resp, err := client.CreateTopics(ctx, req)
	if err == nil {
		for _, e := range resp.Errors {
			err = cmp.Or(err, e)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("create the topics of the embedded broker: %w", err)
	}
	logger.Info("embedded Kafka broker listening", slog.String("addr", b.addr))
	return b, nil
}

// localClient is a kafka-go client of the embedded broker. Call the returned function when done.
func localClient(addr string) (*kafka.Client, func()) {
	transport := &kafka.Transport{ClientID: "inboxworker-dev"}
	return &kafka.Client{Addr: kafka.TCP(addr), Transport: transport, Timeout: 10 * time.Second},
		transport.CloseIdleConnections
}

func (b *devBroker) printHowTo(w io.Writer, cfg *Config) {
	fmt.Fprintf(w, `Embedded Kafka broker listening on %[1]s (in memory: its messages go when the worker stops).
Topics: %[2]s, %[3]s (and %[2]s%[4]s, %[3]s%[4]s for dead letters), %[5]d partitions each.

Produce with any Kafka client, e.g. kcat:
  echo '{"event_id":"evt-1","order_no":"A-1","provider":"alipay","provider_txn_id":"T-1","amount":"99.90","currency":"CNY","result":"SUCCESS","paid_at":"2025-01-01T12:00:00Z"}' \
    | kcat -P -b %[1]s -t %[2]s -k A-1 -H Idempotency-Key=evt-1
  echo '{"event_id":"sms-1","phone":"+8613800138000","template":"verify_code","params":{"code":"123456"}}' \
    | kcat -P -b %[1]s -t %[3]s -k +8613800138000
Read the dead letters with:
  kcat -C -b %[1]s -t %[2]s%[4]s -f '%%k %%h %%s\n'

`, b.addr, cfg.TopicPayments, cfg.TopicSMS, cfg.DLQSuffix, devPartitions)
}
