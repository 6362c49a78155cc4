// Package parked is the operator's view of the park and hand on it (worker parked): list the
// messages parked for a retry, make them due now, or dead-letter them by hand. Listing and retrying
// need Postgres alone; dead-lettering writes to Kafka as the consumer does.
//
// It does not retry anything itself (the worker's retrier does) nor decide what parks.
package parked

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/replay"
	"github.com/inboxworker/inboxworker/internal/startup"
)

// Config is one run of worker parked.
type Config struct {
	// Verb is list, retry or dead-letter (see Verb); Args are its arguments.
	Verb string
	Args []string
	// DLQSuffix names the dead-letter topics. Required for dead-letter.
	DLQSuffix string
	// RetryBudget is one message's retry budget (RETRY_MAX_ELAPSED), as the worker's: list shows what
	// is left of it. Required for list.
	RetryBudget time.Duration
	// Postgres and Kafka say where the park and the brokers are. Kafka is used by dead-letter only.
	Postgres startup.Postgres
	Kafka    startup.Kafka
	// Out receives what the operator reads; Logger the rest. Required.
	Out    io.Writer
	Logger *slog.Logger
}

// Verb splits args into the verb and its arguments, or says what is wrong with them.
func Verb(args []string) (string, []string, error) {
	if len(args) == 0 {
		return "", nil, errors.New("missing what to do: list, retry or dead-letter (see worker parked --help)")
	}
	switch args[0] {
	case "list", "retry", "dead-letter":
		return args[0], args[1:], nil
	}
	return "", nil, fmt.Errorf("unknown parked command %q: use list, retry or dead-letter (see worker parked --help)", args[0])
}

// Run does cfg.Verb.
func Run(ctx context.Context, cfg Config) error {
	pool, err := startup.OpenPostgres(ctx, cfg.Postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := inbox.NewStore(pool, inbox.Config{Logger: cfg.Logger})
	if err != nil {
		return err
	}
	switch cfg.Verb {
	case "list":
		return listParked(ctx, cfg.Out, store, cfg.RetryBudget, cfg.Args)
	case "retry":
		return retryParked(ctx, cfg.Out, store, cfg.Args)
	default:
		return deadLetterParked(ctx, cfg, store)
	}
}

// operatorLease bounds an operator's claim on a parked message while it is dead-lettered: should the
// command die in between, the worker takes the message back once it lapses.
const operatorLease = time.Minute

// operatorWhy is the dlq-error of a message dead-lettered by hand, before its last error.
const operatorWhy = "dead-lettered by an operator from the park"

func listParked(ctx context.Context, out io.Writer, store *inbox.Store, budget time.Duration, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("unexpected argument %q: list takes at most a topic (see worker parked --help)", args[1])
	}
	var topic string
	if len(args) == 1 {
		if err := startup.CheckTopicName(args[0]); err != nil {
			return fmt.Errorf("TOPIC: %w", err)
		}
		topic = args[0]
	}
	list, err := store.Park().List(ctx, topic, 0)
	if err != nil {
		return fmt.Errorf("read the park: %w", err)
	}
	now := time.Now()
	counts := map[string]int{}
	for _, p := range list {
		counts[p.Topic]++
		fmt.Fprintln(out, parkedLine(p, budget, now))
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

// parkedLine describes p on one line of key=value pairs: where it came from, and what it waits for
// (the messages of its key ahead of it, or its next attempt), with what is spent and left of its
// retry budget, its last error, and the reason it gets once the budget runs out.
func parkedLine(p inbox.Parked, budget time.Duration, now time.Time) string {
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
		"key=" + replay.DisplayedKey(p.MessageKey),
		"idempotency_key=" + replay.Displayed(p.IdempotencyKey),
		"ahead=" + strconv.Itoa(p.Ahead),
		"attempts=" + strconv.Itoa(p.Attempts),
		"parked=" + now.Sub(p.ParkedAt).Round(time.Second).String() + "-ago",
		"next=" + due,
		"budget_spent=" + rounded(p.BudgetSpent),
		"budget_left=" + rounded(max(budget-p.BudgetSpent, 0)),
	}
	if p.HeldBy != "" && p.HeldUntil.After(now) {
		fields = append(fields, "held_by="+replay.Displayed(p.HeldBy))
	}
	if p.LastError != "" {
		fields = append(fields, "last_error="+strconv.Quote(p.LastError))
	}
	if p.Reason != "" {
		// Not its reason yet: a parked message has budget left, or it would have left the park.
		fields = append(fields, "reason_if_exhausted="+replay.Displayed(string(p.Reason)))
	}
	return strings.Join(fields, " ")
}

// rounded is a duration for a person: to the second, or to the millisecond under one.
func rounded(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
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
			if err := startup.CheckTopicName(args[1]); err != nil {
				return fmt.Errorf("TOPIC: %w", err)
			}
			topic = args[1]
		}
		n, err = store.Park().RetryAllNow(ctx, topic)
	} else {
		ids, perr := parseIDs(args)
		if perr != nil {
			return perr
		}
		return retryIDs(ctx, out, store, ids)
	}
	if err != nil {
		return fmt.Errorf("retry parked messages: %w", err)
	}
	printDue(out, n)
	return nil
}

func printDue(out io.Writer, n int64) {
	fmt.Fprintf(out, "%d parked messages due now; a message behind others of its key still waits for them\n", n)
}

// retryIDs makes the parked messages ids due now. An id that is not in the park is an error, once
// the others are due.
func retryIDs(ctx context.Context, out io.Writer, store *inbox.Store, ids []int64) error {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	n, err := store.Park().RetryNow(ctx, ids)
	if err != nil {
		return fmt.Errorf("retry parked messages: %w", err)
	}
	if n > 0 {
		printDue(out, n)
	}
	if int(n) == len(ids) {
		return nil
	}
	// Some are not in the park: which, read from the park as it is now.
	list, err := store.Park().List(ctx, "", 0)
	if err != nil {
		return fmt.Errorf("%d of the %d parked messages were made due now; read the park: %w", n, len(ids), err)
	}
	parked := map[int64]bool{}
	for _, p := range list {
		parked[p.ID] = true
	}
	var missing []string
	for _, id := range ids {
		if !parked[id] {
			missing = append(missing, strconv.FormatInt(id, 10))
		}
	}
	if len(missing) == 0 { // they were there, and have left the park since
		return nil
	}
	what, wrong := "parked message "+missing[0], "a wrong id"
	if len(missing) > 1 {
		what, wrong = "parked messages "+strings.Join(missing, ", "), "wrong ids"
	}
	msg := fmt.Sprintf("%s: not in the park (applied, dead-lettered, or %s; see worker parked list)", what, wrong)
	switch {
	case n == 1:
		msg += "; the 1 other was made due now"
	case n > 1:
		msg += fmt.Sprintf("; the %d others were made due now", n)
	}
	return errors.New(msg)
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
func deadLetterParked(ctx context.Context, cfg Config, store *inbox.Store) error {
	out, logger, args := cfg.Out, cfg.Logger, cfg.Args
	if len(args) == 0 {
		return errors.New("missing the ids to dead-letter (see worker parked --help)")
	}
	ids, err := parseIDs(args)
	if err != nil {
		return err
	}
	owner := inbox.NewHolder("worker parked dead-letter")
	admin, err := startup.NewAdmin(cfg.Kafka)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.WaitReady(ctx, nil); err != nil {
		return err
	}
	w := deadletter.NewWriter(cfg.Kafka.Brokers, admin.Transport) // as the worker writes its dead letters
	w.AllowAutoTopicCreation = true
	defer w.Close()
	for i, id := range ids {
		p, err := store.Park().Hold(ctx, id, owner, operatorLease)
		switch {
		case errors.Is(err, inbox.ErrNotParked):
			return fmt.Errorf("parked message %d: not in the park (applied, dead-lettered, or a wrong id; see worker parked list)%s", id, done(i))
		case errors.Is(err, inbox.ErrHeld):
			return fmt.Errorf("parked message %d: the worker is retrying it right now; try again in a moment%s", id, done(i))
		case err != nil:
			return fmt.Errorf("parked message %d: %w%s", id, err, done(i))
		}
		letter := deadLetterOf(p, cfg.DLQSuffix, operatorWhy, time.Now())
		if err := w.WriteMessages(ctx, letter); err != nil {
			// The claim lapses by itself: the worker takes the message back.
			return fmt.Errorf("parked message %d: write its dead letter to %s: %w%s", id, letter.Topic, err, done(i))
		}
		if err := store.Park().Remove(ctx, p); err != nil {
			return fmt.Errorf("parked message %d: dead-lettered to %s, but not taken out of the park: %w%s",
				id, letter.Topic, err, done(i))
		}
		logger.InfoContext(ctx, "dead-lettered a parked message by hand", slog.Int64("id", id),
			slog.String("topic", p.Topic), slog.Int("partition", int(p.Partition)), slog.Int64("offset", p.Offset),
			slog.String("key", p.IdempotencyKey), slog.String("dlq_topic", letter.Topic))
		fmt.Fprintf(out, "dead-lettered id=%d topic=%s partition=%d offset=%d idempotency_key=%s to=%s\n",
			id, p.Topic, p.Partition, p.Offset, replay.Displayed(p.IdempotencyKey), letter.Topic)
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

// deadLetterOf is the dead letter of the parked message p, dead-lettered by an operator rather
// than retried: the original key, value and headers and the dlq-* headers (package deadletter), with
// p's reason (retries_exhausted when it has not run) and attempts, and why (the operator's words)
// in dlq-error with p's last error. Its Topic is p's topic + dlqSuffix.
func deadLetterOf(p inbox.Parked, dlqSuffix, why string, at time.Time) kafka.Message {
	headers := make([]kafka.Header, len(p.Headers))
	for i, h := range p.Headers {
		headers[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	reason := p.Reason
	if reason == "" {
		reason = inboxtype.RetriesExhausted
	}
	text := why
	if p.LastError != "" {
		text += ": " + p.LastError
	}
	letter := deadletter.Letter{
		Reason:    reason,
		Error:     deadletter.ErrorText(errors.New(text)),
		Topic:     p.Topic,
		Partition: int(p.Partition),
		Offset:    p.Offset,
		Attempts:  p.Attempts,
		FailedAt:  at,
		Produced:  p.Produced,
	}
	return letter.Message(dlqSuffix, kafka.Message{Key: p.MessageKey, Value: p.Value, Headers: headers})
}
