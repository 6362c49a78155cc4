// Package replay puts dead letters back on their original topic once their cause is fixed: those of
// a dead-letter topic, read from its first offset to its end offset as of the start without a
// consumer group, then those the topic refused for good, which the worker kept in the table
// dead_letters. Each goes to the topic its dlq-original-topic header names, with its original key,
// value and headers, partitioned by key as producers do.
//
// It deletes nothing (Kafka topics are append-only) and does not decide whether a dead letter's
// cause is fixed: the operator chooses the reason to replay. Each dead letter is put back once, even
// by two replays at once, unless told again (Options.Again): each claims it before the write
// (deadletter.Store.ClaimReplay for a row of dead_letters, ClaimTopicReplay for a place of the topic)
// for a lease that lapses should the replay die before it marks the letter replayed, which a later
// replay then puts back. A letter put back that fails again is dead-lettered again, at a new place:
// a new dead letter. No transaction is open across a write.
package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/inboxworker/inboxworker/inboxtype"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/idkey"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/startup"
)

const (
	fetchMaxBytes = 4 << 20
	fetchMaxWait  = 500 * time.Millisecond
	// maxDisplayed is how many bytes of a header value (an idempotency key, a reason) are printed.
	maxDisplayed = 80
	// writeTimeout bounds the write of a dead letter, which claimLease outlasts: no other replay
	// takes it while a write of it may still land.
	writeTimeout = time.Minute
	claimLease   = 2 * writeTimeout
)

// skippedClaimed labels, in the summary, the dead letters another replay took meanwhile.
const skippedClaimed = "(taken by another replay)"

// Options are what the operator chooses for one replay.
type Options struct {
	// Reason replays only the dead letters whose dlq-reason it is. Defaults to every reason.
	Reason string
	// DryRun prints what would be replayed and writes nothing. Defaults to false.
	DryRun bool
	// Limit is how many dead letters to replay at most. Defaults to 0: all.
	Limit int
	// Again replays the dead letters of the topic a replay put back before, too. Defaults to false:
	// each is replayed once, and a dry run counts those replayed before.
	Again bool
	// Since replays only the dead letters that failed at or after it. Defaults to the zero time: all.
	Since time.Time
	// FromOffset replays only the topic's dead letters from this offset of each partition on (the
	// rows of dead_letters are not in the topic: Since bounds them). Defaults to 0: all.
	FromOffset int64
}

// Config is one replay's configuration.
type Config struct {
	// DLQTopic is the dead-letter topic to replay. Required: a topic name ending with DLQSuffix.
	DLQTopic string
	// DLQSuffix is the dead-letter topics' suffix. Required.
	DLQSuffix string
	Options
	// Kafka and Postgres say where the dead letters are, and how long to wait for each. Required.
	Kafka    startup.Kafka
	Postgres startup.Postgres
	// Out receives one line per dead letter replayed and a summary. Required.
	Out io.Writer
	// Logger receives the progress and the warnings about dead letters skipped. Required.
	Logger *slog.Logger
}

// Replay is one replay, checked and ready to run.
type Replay struct {
	cfg Config
	state
}

// New checks cfg: its errors name DLQ_TOPIC.
func New(cfg Config) (*Replay, error) {
	if err := startup.CheckTopicName(cfg.DLQTopic); err != nil {
		return nil, fmt.Errorf("DLQ_TOPIC: %w", err)
	}
	if !strings.HasSuffix(cfg.DLQTopic, cfg.DLQSuffix) {
		return nil, fmt.Errorf("DLQ_TOPIC: %q is not a dead-letter topic: it does not end with DLQ_SUFFIX %q",
			cfg.DLQTopic, cfg.DLQSuffix)
	}
	return &Replay{cfg: cfg, state: state{dlqTopic: cfg.DLQTopic, suffix: cfg.DLQSuffix, Options: cfg.Options,
		out: cfg.Out, logger: cfg.Logger, skipped: map[string]int{}, owner: inbox.NewHolder("worker replay")}}, nil
}

// Run reads the dead letters, checks that every topic to replay to exists, and replays them (or,
// in a dry run, prints what it would replay). Nothing is written when a check fails.
func (rp *Replay) Run(ctx context.Context) error {
	r := &rp.state
	admin, err := startup.NewAdmin(rp.cfg.Kafka)
	if err != nil {
		return err
	}
	defer admin.Close()
	r.client = admin.Client

	meta, err := admin.WaitReady(ctx, []string{r.dlqTopic})
	if err != nil {
		return err
	}
	partitions, err := topicPartitions(meta, r.dlqTopic)
	if err != nil {
		return err
	}
	pool, err := startup.OpenPostgres(ctx, rp.cfg.Postgres)
	if err != nil {
		return err
	}
	defer pool.Close()
	r.stored = deadletter.NewStore(pool)
	if !r.Again { // --again replays them all: what was replayed before is not asked
		if r.before, err = r.stored.Replayed(ctx, r.dlqTopic); err != nil {
			return tableError(err, "dead_letter_replays")
		}
	}

	r.logger.InfoContext(ctx, "reading the dead letters", slog.String("dlq_topic", r.dlqTopic),
		slog.String("reason", r.Reason), slog.Bool("dry_run", r.DryRun), slog.Int("limit", r.Limit),
		slog.Bool("again", r.Again), slog.Time("since", r.Since), slog.Int64("from_offset", r.FromOffset))
	if err := r.read(ctx, partitions); err != nil {
		return err
	}
	if err := r.readStored(ctx); err != nil {
		return err
	}
	if err := r.checkTargets(ctx); err != nil {
		return err
	}
	if r.DryRun {
		for _, d := range r.letters {
			r.printLetter("would replay", d)
		}
		r.replayed = r.letters
		r.printSummary("dry run: would replay", "")
		return nil
	}
	w := deadletter.NewWriter(rp.cfg.Kafka.Brokers, admin.Transport)
	defer w.Close()
	return r.write(ctx, w)
}

// state is the state of one replay: the dead letters read, and those skipped.
type state struct {
	dlqTopic string
	suffix   string
	Options
	out    io.Writer
	logger *slog.Logger
	client *kafka.Client
	stored *deadletter.Store
	// owner names the replay in its claims on rows of dead_letters and dead_letter_replays.
	owner string
	// before are the topic's dead letters a replay put back before, by place, with their identity.
	before map[deadletter.Place]string

	// letters are the dead letters to replay: the topic's in partition and offset order, then the
	// table's in the order they were stored.
	letters []*deadLetter
	// replayed are those of letters written back, so far.
	replayed []*deadLetter
	// skipped counts the dead letters not replayed, by their reason or by what is wrong with their
	// original topic, as printed.
	skipped map[string]int
	// limited is true when reading stopped at the limit.
	limited bool
}

// deadLetter is one dead letter, ready to be replayed.
type deadLetter struct {
	// Where it is: a partition and offset of the dead-letter topic, or a row of dead_letters.
	partition int
	offset    int64
	storedID  int64  // the row's id in dead_letters; 0 for a message of the topic
	identity  string // deadletter.Letter.Identity
	failedAt  time.Time
	reason    string
	message   kafka.Message // for the original topic: key, value and headers less the dlq-* ones
	// idempotencyKey is the key the worker will read, for the output, or keyProblem why it has none.
	idempotencyKey string
	keyProblem     inboxtype.Reason
}

// topicPartitions returns the partitions of topic in meta, sorted.
func topicPartitions(meta *kafka.MetadataResponse, topic string) ([]int, error) {
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("DLQ_TOPIC: topic %q does not exist", topic)
			}
			return nil, fmt.Errorf("DLQ_TOPIC: topic %q: %w", topic, t.Error)
		}
		var ids []int
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		return ids, nil
	}
	return nil, fmt.Errorf("DLQ_TOPIC: topic %q does not exist", topic)
}

// read reads every partition from its first offset to its end offset as of now, keeping the dead
// letters to replay, until the limit. Nothing is written: a dead letter that would loop back into a
// dead-letter topic is found before any is replayed.
func (r *state) read(ctx context.Context, partitions []int) error {
	first, err := r.offsets(ctx, partitions, kafka.FirstOffsetOf)
	if err != nil {
		return err
	}
	end, err := r.offsets(ctx, partitions, kafka.LastOffsetOf)
	if err != nil {
		return err
	}
	for _, p := range partitions {
		if err := r.readPartition(ctx, p, max(first[p], r.FromOffset), end[p]); err != nil || r.limited {
			return err
		}
	}
	return nil
}

// offsets asks for the first or the last offset of each partition (one request each: a broker may
// refuse a request that names a partition twice).
func (r *state) offsets(ctx context.Context, partitions []int, which func(int) kafka.OffsetRequest) (map[int]int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range partitions {
		req.Topics[r.dlqTopic] = append(req.Topics[r.dlqTopic], which(p))
	}
	resp, err := r.client.ListOffsets(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("list the offsets of %s: %w", r.dlqTopic, err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[r.dlqTopic] {
		if p.Error != nil {
			return nil, fmt.Errorf("list the offsets of %s/%d: %w", r.dlqTopic, p.Partition, p.Error)
		}
		if which(p.Partition).Timestamp == kafka.FirstOffset {
			out[p.Partition] = p.FirstOffset
		} else {
			out[p.Partition] = p.LastOffset
		}
	}
	for _, p := range partitions {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("list the offsets of %s: no answer for partition %d", r.dlqTopic, p)
		}
	}
	return out, nil
}

func (r *state) readPartition(ctx context.Context, partition int, first, end int64) error {
	for offset := first; offset < end; {
		resp, err := r.client.Fetch(ctx, &kafka.FetchRequest{Topic: r.dlqTopic, Partition: partition,
			Offset: offset, MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: fetchMaxWait})
		if err == nil {
			err = resp.Error
		}
		if err != nil {
			return fmt.Errorf("read %s/%d at offset %d: %w", r.dlqTopic, partition, offset, err)
		}
		from := offset
		for offset < end {
			rec, err := resp.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s/%d at offset %d: %w", r.dlqTopic, partition, offset, err)
			}
			if rec.Offset < offset { // a batch may begin before the offset asked for
				continue
			}
			if rec.Offset >= end {
				offset = end
				break
			}
			offset = rec.Offset + 1
			if err := r.take(ctx, partition, rec); err != nil || r.limited {
				return err
			}
		}
		if offset == from {
			return fmt.Errorf("read %s/%d: no message at offset %d, below the end offset %d", r.dlqTopic,
				partition, offset, end)
		}
	}
	return nil
}

// take keeps rec, a message of the dead-letter topic, for replay if it matches the reason and names
// a topic to replay to.
func (r *state) take(ctx context.Context, partition int, rec *kafka.Record) error {
	key, err := protocol.ReadAll(rec.Key)
	if err != nil {
		return fmt.Errorf("read %s/%d offset %d: %w", r.dlqTopic, partition, rec.Offset, err)
	}
	value, err := protocol.ReadAll(rec.Value)
	if err != nil {
		return fmt.Errorf("read %s/%d offset %d: %w", r.dlqTopic, partition, rec.Offset, err)
	}
	letter, headers := deadletter.Read(rec.Headers)
	d := &deadLetter{partition: partition, offset: rec.Offset, reason: string(letter.Reason),
		identity: letter.Identity(), failedAt: letter.FailedAt, message: kafka.Message{Topic: letter.Topic, Key: key, Value: value, Headers: headers, Time: letter.Produced}}
	log := r.logger.With(slog.String("dlq_topic", r.dlqTopic), slog.Int("partition", partition),
		slog.Int64("offset", rec.Offset), slog.String("reason", d.reason))
	return r.keep(ctx, d, log)
}

// readStored reads the dead letters the dead-letter topic refused, which the worker kept in the
// table dead_letters, and not replayed yet, keeping those to replay until the limit.
func (r *state) readStored(ctx context.Context) error {
	if r.limited {
		return nil
	}
	err := r.stored.Pending(ctx, r.dlqTopic, func(s deadletter.Stored) (bool, error) {
		letter, headers := deadletter.Read(s.Headers)
		d := &deadLetter{storedID: s.ID, reason: string(s.Letter.Reason), failedAt: s.Letter.FailedAt,
			message: kafka.Message{Topic: s.Letter.Topic, Key: s.Key, Value: s.Value, Headers: headers,
				Time: letter.Produced}}
		log := r.logger.With(slog.String("dlq_topic", r.dlqTopic), slog.Int64("dead_letters_id", s.ID),
			slog.String("reason", d.reason))
		err := r.keep(ctx, d, log)
		return err == nil && !r.limited, err
	})
	return tableError(err, "dead_letters")
}

// tableError is err, or, when it says that table does not exist, what that means.
func tableError(err error, table string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedTable {
		return fmt.Errorf("DATABASE_URL: the database has no table %s: it is not the worker's, "+
			"or not migrated (worker migrate)", table)
	}
	return err
}

// sqlstateUndefinedTable is Postgres's undefined_table.
const sqlstateUndefinedTable = "42P01"

// skippedBefore labels, in the summary, the topic's dead letters a replay put back before.
const skippedBefore = "(replayed before; --again replays them)"

// keep keeps d for replay if it matches the options and names a topic to replay to.
func (r *state) keep(ctx context.Context, d *deadLetter, log *slog.Logger) error {
	switch {
	case r.Reason != "" && d.reason != r.Reason:
		r.skipped[displayedReason(d.reason)]++
		return nil
	case d.failedAt.Before(r.Since):
		r.skipped["(before --since)"]++
		return nil
	case !r.Again && d.storedID == 0 && r.before[d.place()] == d.identity:
		r.skipped[skippedBefore]++
		return nil
	}
	target := d.message.Topic
	switch {
	case target == "":
		r.skipped["(no "+deadletter.HeaderOriginalTopic+")"]++
		log.WarnContext(ctx, "skipped a dead letter without a "+deadletter.HeaderOriginalTopic+
			" header: where it came from is unknown")
		return nil
	case startup.CheckTopicName(target) != nil:
		r.skipped["(invalid "+deadletter.HeaderOriginalTopic+")"]++
		log.WarnContext(ctx, "skipped a dead letter whose "+deadletter.HeaderOriginalTopic+" is not a topic name",
			slog.String("original_topic", strconv.Quote(target)))
		return nil
	case strings.HasSuffix(target, r.suffix):
		return fmt.Errorf("%s: its %s %q ends with DLQ_SUFFIX %q: refusing to replay into a dead-letter topic; "+
			"nothing was replayed", r.where(d), deadletter.HeaderOriginalTopic, target, r.suffix)
	}
	// The key the worker will read, for the output; never the Kafka message key, which for an SMS is
	// a phone number.
	d.idempotencyKey, d.keyProblem, _ = idkey.Of(d.message)
	r.letters = append(r.letters, d)
	r.limited = r.Limit > 0 && len(r.letters) >= r.Limit
	return nil
}

// place is d's place in the dead-letter topic.
func (d *deadLetter) place() deadletter.Place {
	return deadletter.Place{Partition: d.partition, Offset: d.offset}
}

// where names d's place, for errors: its partition and offset, or its row in dead_letters.
func (r *state) where(d *deadLetter) string {
	if d.storedID != 0 {
		return fmt.Sprintf("%s row %d of dead_letters", r.dlqTopic, d.storedID)
	}
	return fmt.Sprintf("%s/%d offset %d", r.dlqTopic, d.partition, d.offset)
}

// checkTargets fails when a topic to replay to does not exist: nothing is created, and nothing is
// written to the other topics.
func (r *state) checkTargets(ctx context.Context) error {
	counts := map[string]int{}
	for _, d := range r.letters {
		counts[d.message.Topic]++
	}
	if len(counts) == 0 {
		return nil
	}
	targets := slices.Sorted(maps.Keys(counts))
	meta, err := r.client.Metadata(ctx, &kafka.MetadataRequest{Topics: targets})
	if err != nil {
		return fmt.Errorf("look up the topics to replay to: %w", err)
	}
	present := map[string]bool{}
	for _, t := range meta.Topics {
		if t.Error == nil && len(t.Partitions) > 0 {
			present[t.Name] = true
		}
	}
	for _, t := range targets {
		if !present[t] {
			return fmt.Errorf("topic %q, the %s of %d dead letter(s), does not exist; nothing was replayed",
				t, deadletter.HeaderOriginalTopic, counts[t])
		}
	}
	return nil
}

// write produces the dead letters one at a time, each acknowledged before the next is written and
// printed, so that what is printed is what was replayed. A dead letter of the table is claimed
// before it is written, and marked replayed once written; one another replay claimed meanwhile is
// skipped.
func (r *state) write(ctx context.Context, w *kafka.Writer) error {
	for _, d := range r.letters {
		claimed, err := r.claim(ctx, d)
		if err != nil {
			return r.stop(ctx, d, "; failed at "+r.where(d), err)
		}
		if !claimed {
			r.skipped[skippedClaimed]++
			continue
		}
		if err := r.writeOne(ctx, w, d); err != nil {
			return r.stop(ctx, d, "; failed at "+r.where(d), fmt.Errorf("replay %s to %s: %w (%d of %d replayed "+
				"before it; it may or may not have been written)", r.where(d), d.message.Topic, err, len(r.replayed), len(r.letters)))
		}
		r.replayed = append(r.replayed, d)
		// Written but not marked, it would be replayed again by the next run once its claim lapses:
		// the inbox skips a key applied before, so that does no harm, but it is reported.
		if err := r.mark(context.WithoutCancel(ctx), d); err != nil {
			r.printLetter("replayed", d)
			r.printSummary("replayed", "; failed to mark "+r.where(d)+" replayed")
			return fmt.Errorf("%w: it was replayed, and the next replay may put it back again", err)
		}
		r.printLetter("replayed", d)
	}
	r.printSummary("replayed", "")
	return nil
}

// claim claims d for this replay before it is written: its row of dead_letters, or its place in the
// topic. It reports false when another replay holds it, or put it back meanwhile.
func (r *state) claim(ctx context.Context, d *deadLetter) (bool, error) {
	if d.storedID != 0 {
		return r.stored.ClaimReplay(ctx, d.storedID, r.owner, claimLease)
	}
	return r.stored.ClaimTopicReplay(ctx, r.dlqTopic, d.place(), d.identity, r.owner, claimLease, r.Again)
}

// mark records that d, claimed and written, was replayed.
func (r *state) mark(ctx context.Context, d *deadLetter) error {
	if d.storedID != 0 {
		return r.stored.MarkReplayed(ctx, d.storedID, r.owner)
	}
	return r.stored.MarkTopicReplayed(ctx, r.dlqTopic, d.place(), r.owner)
}

// writeOne writes d within its claim's lease.
func (r *state) writeOne(ctx context.Context, w *kafka.Writer, d *deadLetter) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return w.WriteMessages(ctx, d.message)
}

// stop prints the summary of a replay that stops at d with err, and returns the error to end it with.
func (r *state) stop(ctx context.Context, d *deadLetter, note string, err error) error {
	if ctx.Err() != nil {
		r.printSummary("interrupted: replayed", "")
		return ctx.Err()
	}
	r.printSummary("replayed", note)
	return err
}

func (r *state) printLetter(verb string, d *deadLetter) {
	key := displayed(d.idempotencyKey)
	switch d.keyProblem {
	case "":
	case inboxtype.InvalidPayload:
		key = "(none: the value is not JSON)"
	case inboxtype.InvalidIdempotencyKey:
		key = "(invalid)"
	default:
		key = "(none)"
	}
	place := fmt.Sprintf("partition=%d offset=%d", d.partition, d.offset)
	if d.storedID != 0 {
		place = fmt.Sprintf("dead_letters_id=%d", d.storedID)
	}
	fmt.Fprintf(r.out, "%s %s %s reason=%s to=%s key=%s\n", verb, r.dlqTopic, place,
		displayedReason(d.reason), d.message.Topic, key)
}

// printSummary prints how many dead letters were replayed and how many skipped, by reason.
func (r *state) printSummary(verb string, note string) {
	total := 0
	var parts []string
	for _, label := range slices.Sorted(maps.Keys(r.skipped)) {
		total += r.skipped[label]
		parts = append(parts, fmt.Sprintf("%s %d", label, r.skipped[label]))
	}
	skipped := strconv.Itoa(total)
	if total > 0 {
		skipped += " (" + strings.Join(parts, ", ") + ")"
	}
	if r.limited {
		note = fmt.Sprintf("; stopped at --limit %d", r.Limit) + note
	}
	stored := 0
	for _, d := range r.replayed {
		if d.storedID != 0 {
			stored++
		}
	}
	if stored > 0 {
		note = fmt.Sprintf(" (%d of them from the table dead_letters)", stored) + note
	}
	fmt.Fprintf(r.out, "%s %d, skipped %s from %s%s\n", verb, len(r.replayed), skipped, r.dlqTopic, note)
}

func displayedReason(reason string) string {
	if reason == "" {
		return "(no " + deadletter.HeaderReason + ")"
	}
	return displayed(reason)
}

// plainToken is what displayed prints unquoted.
var plainToken = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)

// displayed is a header value for one line of output: cut to maxDisplayed bytes, and quoted unless
// it is a plain token (a header may hold anything, line breaks included).
// Displayed is displayed, for the other commands that print header values.
func Displayed(s string) string { return displayed(s) }

// DisplayedKey is a message's Kafka key for one line of output: a phone number masked, as
// everywhere else; (none) when it had none, and was ordered by its idempotency key.
func DisplayedKey(key []byte) string {
	switch s := string(key); {
	case key == nil:
		return "(none)"
	case notify.ValidPhone(s):
		return notify.MaskPhone(s)
	default:
		return displayed(s)
	}
}

func displayed(s string) string {
	if len(s) > maxDisplayed {
		n := maxDisplayed
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "..."
	}
	if plainToken.MatchString(s) {
		return s
	}
	return strconv.Quote(s)
}
