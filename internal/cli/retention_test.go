package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/devbroker"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// TestSettleRetention checks the inbox retentions the worker settles at start against topics with
// Kafka's defaults (7 days, segments rolled every 7 days), shorter and infinite retentions, and a
// topic that does not exist: an unset retention follows the topic and never warns, an explicit one
// wins and warns when it is shorter than the topic can redeliver. Every case also checks the info
// line that says where the retention came from, so a topic configuration that could not be read
// cannot pass for "no warning".
func TestSettleRetention(t *testing.T) {
	t.Parallel()
	cluster := kafkatest.Start(t, 1)
	createTopics(t, cluster.Addr, map[string]map[string]string{
		"default.a": nil, "default.b": nil, // Kafka's defaults, as kfake has them
		"short.a":   {"retention.ms": "3600000", "segment.ms": "600000"},
		"forever.a": {"retention.ms": "-1"},
	})

	type line struct{ inbox, topic, source string }
	for _, tt := range []struct {
		name     string
		env      map[string]string
		payments time.Duration // settled INBOX_RETENTION_PAYMENTS
		sms      time.Duration // settled INBOX_RETENTION_SMS
		info     map[string]line
		warned   []string // settings warned about
	}{
		{
			name:     "DefaultsOnKafkaDefaults",
			env:      map[string]string{"TOPIC_PAYMENTS": "default.a", "TOPIC_SMS": "default.b"},
			payments: 337 * time.Hour, sms: 337 * time.Hour,
			info: map[string]line{
				"INBOX_RETENTION_PAYMENTS": {"337h0m0s", "168h0m0s", "topic"},
				"INBOX_RETENTION_SMS":      {"337h0m0s", "168h0m0s", "topic"},
			},
		},
		{
			name: "ExplicitShorterWarns",
			env: map[string]string{"TOPIC_PAYMENTS": "default.a", "TOPIC_SMS": "default.b",
				"INBOX_RETENTION_PAYMENTS": "72h", "INBOX_RETENTION_SMS": "400h"},
			payments: 72 * time.Hour, sms: 400 * time.Hour,
			info: map[string]line{
				"INBOX_RETENTION_PAYMENTS": {"72h0m0s", "168h0m0s", "setting"},
				"INBOX_RETENTION_SMS":      {"400h0m0s", "168h0m0s", "setting"},
			},
			warned: []string{"INBOX_RETENTION_PAYMENTS"},
		},
		{
			// Equal to retention.ms is still short: a message can be read until its segment, which
			// took messages for up to segment.ms, is older than retention.ms.
			name:     "ExplicitEqualToRetentionMsWarns",
			env:      map[string]string{"TOPIC_PAYMENTS": "default.a", "TOPIC_SMS": "default.b", "INBOX_RETENTION_SMS": "168h"},
			payments: 337 * time.Hour, sms: 168 * time.Hour,
			info: map[string]line{
				"INBOX_RETENTION_PAYMENTS": {"337h0m0s", "168h0m0s", "topic"},
				"INBOX_RETENTION_SMS":      {"168h0m0s", "168h0m0s", "setting"},
			},
			warned: []string{"INBOX_RETENTION_SMS"},
		},
		{
			name:     "ShortTopicAndForever",
			env:      map[string]string{"TOPIC_PAYMENTS": "forever.a", "TOPIC_SMS": "short.a"},
			payments: 30 * 24 * time.Hour, sms: 2*time.Hour + 10*time.Minute,
			info: map[string]line{
				"INBOX_RETENTION_PAYMENTS": {"720h0m0s", "forever", "topic"},
				"INBOX_RETENTION_SMS":      {"2h10m0s", "1h0m0s", "topic"},
			},
			warned: []string{"INBOX_RETENTION_PAYMENTS"},
		},
		{
			name:     "MissingTopic",
			env:      map[string]string{"TOPIC_PAYMENTS": "default.a", "TOPIC_SMS": "not.yet"},
			payments: 337 * time.Hour, sms: 337 * time.Hour,
			info: map[string]line{
				"INBOX_RETENTION_PAYMENTS": {"337h0m0s", "168h0m0s", "topic"},
				"INBOX_RETENTION_SMS":      {"337h0m0s", "168h0m0s", "kafka defaults"},
			},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.env["KAFKA_BROKERS"] = cluster.Addr
			cfg := parseConfig(t, tt.env, "run")
			var buf bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&buf, nil))
			if err := checkKafka(context.Background(), cfg, logger); err != nil {
				t.Fatal(err)
			}
			t.Log(buf.String())
			if got, sms := cfg.Route(paymentsInbox).Retention, cfg.Route(smsInbox).Retention; got != tt.payments || sms != tt.sms {
				t.Errorf("settled payments %s, sms %s; want %s, %s", got, sms, tt.payments, tt.sms)
			}
			info := map[string]line{}
			var warned []string
			for l := range strings.Lines(buf.String()) {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatal(err)
				}
				setting, _ := m["setting"].(string)
				switch m["msg"] {
				case "inbox retention":
					info[setting] = line{m["inbox_retention"].(string), m["topic_retention"].(string), m["source"].(string)}
				case startup.RetentionWarning:
					warned = append(warned, setting)
				}
			}
			for setting, want := range tt.info {
				if info[setting] != want {
					t.Errorf("%s: inbox retention line %+v, want %+v", setting, info[setting], want)
				}
			}
			if strings.Join(warned, ",") != strings.Join(tt.warned, ",") {
				t.Errorf("warned about %v, want %v", warned, tt.warned)
			}
		})
	}
}

// createTopics creates topics, one partition each, with their configuration.
func createTopics(t *testing.T, addr string, topics map[string]map[string]string) {
	t.Helper()
	client, closeClient := devbroker.Client(addr)
	defer closeClient()
	req := &kafka.CreateTopicsRequest{}
	for name, configs := range topics {
		tc := kafka.TopicConfig{Topic: name, NumPartitions: 1, ReplicationFactor: 1}
		for k, v := range configs {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		req.Topics = append(req.Topics, tc)
	}
	resp, err := client.CreateTopics(context.Background(), req)
	if err == nil {
		for _, e := range resp.Errors {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		t.Fatalf("create topics: %v", err)
	}
}
