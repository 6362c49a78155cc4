package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// parkedCommand is `worker parked list|retry|dead-letter`: what waits in the park, and an operator's
// hand on it. It is a command of its own rather than an option of replay: replay reads dead-letter
// topics in Kafka, the park is a table in Postgres, and listing it needs no broker.
var parkedCommand = &command{
	name:    "parked",
	args:    "list [TOPIC] | retry ID...|all [TOPIC] | dead-letter ID...",
	maxArgs: 1000,
	summary: "list the messages parked for a retry, retry them now, or dead-letter them",
	details: "A message whose retryable error outlasts its first retries in place is parked in Postgres,\n" +
		"and so is every later message of its key, behind it, so that the key keeps its order while\n" +
		"the rest of its partition goes on. The worker retries the head of each key until it is\n" +
		"applied or its retry budget (RETRY_MAX_ELAPSED) runs out.\n" +
		"\n" +
		"  list [TOPIC]          one line per parked message, each key's head first: where it came\n" +
		"                        from, its Kafka and idempotency keys, how many of its key wait ahead\n" +
		"                        of it, its attempts, when it is due and its last error; then a count\n" +
		"                        per topic\n" +
		"  retry ID...|all [TOPIC]\n" +
		"                        make them due now (a message still waits for those ahead of it)\n" +
		"  dead-letter ID...     write them to their dead-letter topic (the original key, value and\n" +
		"                        headers, with the dlq-* headers and the message's reason), then take\n" +
		"                        them out of the park; the key's next message gets its turn. A message\n" +
		"                        the worker is retrying at that moment is refused: try again.\n" +
		"\n" +
		"Only dead-letter connects to Kafka.",
	settings: join([]string{"KAFKA_BROKERS", "KAFKA_SASL_MECHANISM", "KAFKA_USERNAME", "KAFKA_PASSWORD",
		"KAFKA_TLS", "DLQ_SUFFIX"}, databaseSettings, logSettings),
	run: parkedCmd,
}

// operatorLease bounds an operator's claim on a parked message while it is dead-lettered: should the
// command die in between, the worker takes the message back once it lapses.
const operatorLease = time.Minute

// operatorWhy is the dlq-error of a message dead-lettered by hand, before its last error.
const operatorWhy = "dead-lettered by an operator from the park"

func parkedCmd(ctx context.Context, a *app, cfg *Config, args []string) error {
	if len(args) == 0 {
		return errors.New("missing what to do: list, retry or dead-letter (see worker parked --help)")
	}
	verb, args := args[0], args[1:]
	switch verb {
	case "list", "retry", "dead-letter":
	default:
		return fmt.Errorf("unknown parked command %q: use list, retry or dead-letter (see worker parked --help)", verb)
	}
	logger := newLogger(cfg, a.stderr)
	logStart(ctx, logger, "parked "+verb, cfg)
	pool, err := openDatabase(ctx, cfg, logger, "")
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := inbox.NewStore(pool, inbox.Config{Logger: logger})
	if err != nil {
		return err
	}
	switch verb {
	case "list":
		return listParked(ctx, a.stdout, store, args)
	case "retry":
		return retryParked(ctx, a.stdout, store, args)
	default:
		return deadLetterParked(ctx, a.stdout, cfg, logger, store, args)
	}
}

func listParked(ctx context.Context, out io.Writer, store *inbox.Store, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("unexpected argument %q: list takes at most a topic (see worker parked --help)", args[1])
	}
	var topic string
	if len(args) == 1 {
		if err := parseTopic(&topic, args[0]); err != nil {
			return fmt.Errorf("TOPIC: %w", err)
		}
	}
	list, err := store.List(ctx, topic, 0)
	if err != nil {
		return fmt.Errorf("read the park: %w", err)
	}
	now := time.Now()
	counts := map[string]int{}
	for _, p := range list {
		counts[p.Topic]++
		fmt.Fprintln(out, parkedLine(p, now))
	}
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", t, counts[t]))
	}
	summary := fmt.Sprintf("%d parked", len(list))
	if len(parts) > 0 {
		summary += " (" + strings.Join(parts, ", ") + ")"
	}
	fmt.Fprintln(out, summary)
	return nil
}

// parkedLine describes p on one line of key=value pairs.
func parkedLine(p inbox.Parked, now time.Time) string {
	due := "due"
	switch {
	case p.Ahead > 0:
		due = fmt.Sprintf("after-%d-ahead", p.Ahead)
	case p.NextAttemptAt.After(now):
		due = "in-" + p.NextAttemptAt.Sub(now).Round(time.Second).String()
	}
	fields := []string{
		"id=" + strconv.FormatInt(p.ID, 10),
		"topic=" + p.Topic,
		"partition=" + strconv.Itoa(int(p.Partition)),
		"offset=" + strconv.FormatInt(p.Offset, 10),
		"key=" + displayedKey(p.MessageKey),
		"idempotency_key=" + displayed(p.IdempotencyKey),
		"ahead=" + strconv.Itoa(p.Ahead),
		"attempts=" + strconv.Itoa(p.Attempts),
		"parked=" + now.Sub(p.ParkedAt).Round(time.Second).String() + "-ago",
		"next=" + due,
	}
	if p.Reason != "" {
		fields = append(fields, "reason="+displayed(string(p.Reason)))
	}
	if p.ClaimedBy != "" && p.ClaimedUntil.After(now) {
		fields = append(fields, "claimed_by="+displayed(p.ClaimedBy))
	}
	if p.LastError != "" {
		fields = append(fields, "error="+strconv.Quote(p.LastError))
	}
	return strings.Join(fields, " ")
}

// displayedKey is a message's Kafka key for output: a phone number masked, as everywhere else;
// (none) when it had none, and was ordered by its idempotency key.
func displayedKey(key []byte) string {
	switch s := string(key); {
	case key == nil:
		return "(none)"
	case notify.ValidPhone(s):
		return notify.MaskPhone(s)
	default:
		return displayed(s)
	}
}

func retryParked(ctx context.Context, out io.Writer, store *inbox.Store, args []string) error {
	if len(args) == 0 {
		return errors.New("missing the ids to retry, or all (see worker parked --help)")
	}
	var (
		n   int64
		err error
	)
	if args[0] == "all" {
		var topic string
		switch {
		case len(args) > 2:
			return fmt.Errorf("unexpected argument %q: retry all takes at most a topic", args[2])
		case len(args) == 2:
			if err := parseTopic(&topic, args[1]); err != nil {
				return fmt.Errorf("TOPIC: %w", err)
			}
		}
		n, err = store.RetryAllNow(ctx, topic)
	} else {
		ids, perr := parseIDs(args)
		if perr != nil {
			return perr
		}
		n, err = store.RetryNow(ctx, ids)
	}
	if err != nil {
		return fmt.Errorf("retry parked messages: %w", err)
	}
	fmt.Fprintf(out, "%d parked messages due now; a message behind others of its key still waits for them\n", n)
	return nil
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("ID: %q is not the id of a parked message (see worker parked list)", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// deadLetterParked dead-letters the parked messages ids, each in turn: claim it, so that no worker
// retries it meanwhile; write its dead letter, acknowledged by all in-sync replicas; then take it out
// of the park. A failure leaves the message parked (its dead letter perhaps written, then written
// again by the next attempt: never lost) and stops the command.
func deadLetterParked(ctx context.Context, out io.Writer, cfg *Config, logger *slog.Logger, store *inbox.Store,
	args []string) error {
	if len(args) == 0 {
		return errors.New("missing the ids to dead-letter (see worker parked --help)")
	}
	ids, err := parseIDs(args)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	owner := fmt.Sprintf("worker parked dead-letter on %s, pid %d", host, os.Getpid())
	admin, err := newKafkaAdmin(cfg)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := waitForKafka(ctx, cfg, logger, admin, nil); err != nil {
		return err
	}
	w := &kafka.Writer{
		Addr:                   kafka.TCP(cfg.KafkaBrokers...),
		Transport:              admin.transport,
		Balancer:               &kafka.Hash{}, // as the worker writes its dead letters
		RequiredAcks:           kafka.RequireAll,
		BatchSize:              1,
		BatchTimeout:           time.Millisecond,
		AllowAutoTopicCreation: true,
	}
	defer w.Close()
	for i, id := range ids {
		p, err := store.Claim(ctx, id, owner, operatorLease)
		switch {
		case errors.Is(err, inbox.ErrNotParked):
			return fmt.Errorf("parked message %d: not in the park (applied, dead-lettered, or a wrong id)%s", id, done(i))
		case errors.Is(err, inbox.ErrClaimed):
			return fmt.Errorf("parked message %d: the worker is retrying it right now; try again in a moment%s", id, done(i))
		case err != nil:
			return fmt.Errorf("parked message %d: %w%s", id, err, done(i))
		}
		letter := consumer.ParkedDeadLetter(p, cfg.DLQSuffix, operatorWhy, time.Now())
		if err := w.WriteMessages(ctx, letter); err != nil {
			// The claim lapses by itself: the worker takes the message back.
			return fmt.Errorf("parked message %d: write its dead letter to %s: %w%s", id, letter.Topic, err, done(i))
		}
		if err := store.Remove(ctx, p); err != nil {
			return fmt.Errorf("parked message %d: dead-lettered to %s, but not taken out of the park: %w%s",
				id, letter.Topic, err, done(i))
		}
		logger.InfoContext(ctx, "dead-lettered a parked message by hand", slog.Int64("id", id),
			slog.String("topic", p.Topic), slog.Int("partition", int(p.Partition)), slog.Int64("offset", p.Offset),
			slog.String("key", p.IdempotencyKey), slog.String("dlq_topic", letter.Topic))
		fmt.Fprintf(out, "dead-lettered id=%d topic=%s partition=%d offset=%d idempotency_key=%s to=%s\n",
			id, p.Topic, p.Partition, p.Offset, displayed(p.IdempotencyKey), letter.Topic)
	}
	return nil
}

// done says how many of the ids were dead-lettered before one failed.
func done(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (the %d before it were dead-lettered)", n)
}
