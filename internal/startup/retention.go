package startup

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// RetentionWarning is the message of the warning about an inbox that forgets keys sooner than its
// topic can redeliver their messages.
const RetentionWarning = "inbox retention is shorter than the topic's retention"

// Kafka's defaults for a topic (log.retention.hours = 168, log.roll.hours = 168), assumed for a
// topic whose configuration cannot be read: one created later gets them unless told otherwise.
const (
	kafkaDefaultRetention = 7 * 24 * time.Hour
	kafkaDefaultSegment   = 7 * 24 * time.Hour
)

// retentionMargin covers what the topic's settings do not: the broker deletes expired segments on
// a timer (log.retention.check.interval.ms, 5 minutes by default), and clocks differ.
const retentionMargin = time.Hour

// foreverRetention is the default inbox retention for a topic that keeps messages forever
// (retention.ms = -1). No finite retention is long enough there; keeping every key forever would
// grow the inbox without bound. 30 days covers any redelivery but a reset of the group to the
// earliest offset, which a warning at start names.
const foreverRetention = 30 * 24 * time.Hour

// topicRetention is how long a topic can hand out a message: Kafka deletes a segment only once its
// newest message is older than retention.ms, and a segment takes new messages for up to segment.ms,
// so a message can be read up to retention.ms + segment.ms after it was written.
type topicRetention struct {
	retention, segment time.Duration
	forever            bool // retention.ms = -1 (or beyond a century)
}

func (t topicRetention) readable() time.Duration { return t.retention + t.segment }

func (t topicRetention) retentionText() string {
	if t.forever {
		return "forever"
	}
	return t.retention.String()
}

// settleRetention makes each inbox remember keys at least as long as its topic can redeliver their
// messages: a message Kafka hands out again after its key was purged (a consumer group reset to the
// earliest offset, say) would be applied twice. An unset retention (0) becomes the topic's
// retention.ms + segment.ms + retentionMargin, read now; for a topic that keeps messages forever,
// foreverRetention with a warning; for a topic whose configuration cannot be read (not created yet,
// or no permission to describe it), what Kafka's defaults would give, with a warning. A setting
// given explicitly wins, with a warning when it is shorter than what the topic can redeliver.
// Each topic gets one info line saying which retention its inbox uses and why.
func (a *Admin) settleRetention(ctx context.Context, topics []Topic, existing []string) {
	logger := a.k.Logger
	read := a.readTopicRetention(ctx, existing)
	for i := range topics {
		r := &topics[i]
		topic, known := read[r.Name]
		source := "topic"
		if !known {
			topic, source = topicRetention{retention: kafkaDefaultRetention, segment: kafkaDefaultSegment}, "kafka defaults"
		}
		switch {
		case r.InboxRetention != 0:
			source = "setting"
		case topic.forever:
			r.InboxRetention = foreverRetention
		default:
			r.InboxRetention = topic.readable() + retentionMargin
		}
		attrs := []any{slog.String("topic", r.Name), slog.String("setting", r.RetentionSetting),
			slog.String("inbox_retention", r.InboxRetention.String()), slog.String("topic_retention", topic.retentionText()),
			slog.String("segment", topic.segment.String()), slog.String("source", source)}
		logger.InfoContext(ctx, "inbox retention", attrs...)
		if known && (topic.forever || r.InboxRetention < topic.readable()) {
			fix := "raise " + r.RetentionSetting + " to at least the topic's retention.ms + segment.ms, or lower them"
			if topic.forever {
				fix = "set a retention.ms on the topic; until then, never reset the group to the earliest offset"
			}
			logger.WarnContext(ctx, RetentionWarning, append(attrs,
				slog.String("why", "a message Kafka redelivers after its key is purged would be applied again; "+fix))...)
		}
	}
}

// readTopicRetention returns the retention of each of topics whose configuration could be read.
func (a *Admin) readTopicRetention(ctx context.Context, topics []string) map[string]topicRetention {
	logger := a.k.Logger
	out := map[string]topicRetention{}
	if len(topics) == 0 {
		return out
	}
	req := &kafka.DescribeConfigsRequest{}
	for _, t := range topics {
		req.Resources = append(req.Resources, kafka.DescribeConfigRequestResource{
			ResourceType: kafka.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms", "segment.ms"}})
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := a.Client.DescribeConfigs(ctx, req)
	if err != nil {
		logger.WarnContext(ctx, "could not read the topics' retention.ms; assuming Kafka's defaults",
			slog.String("err", err.Error()))
		return out
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			logger.WarnContext(ctx, "could not read the topic's retention.ms; assuming Kafka's defaults",
				slog.String("topic", r.ResourceName), slog.String("err", r.Error.Error()))
			continue
		}
		t := topicRetention{segment: kafkaDefaultSegment}
		found := false
		for _, e := range r.ConfigEntries {
			d, forever, err := parseMillis(e.ConfigValue)
			if err != nil {
				continue
			}
			switch e.ConfigName {
			case "retention.ms":
				t.retention, t.forever, found = d, forever, true
			case "segment.ms":
				if !forever {
					t.segment = d
				}
			}
		}
		if !found {
			logger.WarnContext(ctx, "the topic's configuration has no retention.ms; assuming Kafka's defaults",
				slog.String("topic", r.ResourceName))
			continue
		}
		out[r.ResourceName] = t
	}
	return out
}

// parseMillis parses a Kafka duration in milliseconds; -1, or more than a century, is forever.
func parseMillis(v string) (d time.Duration, forever bool, err error) {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, err
	}
	const century = 100 * 365 * 24 * time.Hour
	if ms < 0 || ms > century.Milliseconds() {
		return 0, true, nil
	}
	return time.Duration(ms) * time.Millisecond, false, nil
}
