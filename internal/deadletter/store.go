package deadletter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/inboxtype"
)

// Stored is a dead letter kept in the dead_letters table because its dead-letter topic refused it.
// It holds everything the dead letter would have carried.
type Stored struct {
	// ID is the row's, set by the table.
	ID int64
	// DLQTopic is the dead-letter topic that refused it.
	DLQTopic string
	Letter   Letter
	Key      []byte
	Value    []byte
	// Headers are the dead letter's: the original message's, then the dlq-* ones (Letter.Headers).
	Headers []kafka.Header
	// WriteError says why the dead-letter topic refused it.
	WriteError string
	// StoredAt is set by the table.
	StoredAt time.Time
}

// DB is what Store needs of Postgres: a pool, a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store keeps dead letters in the dead_letters table (migrations 00005 and 00010). Every method is one short
// statement, safe for concurrent use, and returns Postgres's errors as they are, for the caller to
// classify.
//
// A dead letter may be stored twice (a crash after the row was written and before the offset of its
// message was committed); never none. There is no unique constraint to stop that: a message's
// position does not identify it once a topic is recreated, and a duplicate is harmless to replay,
// since the inbox skips a key applied before.
type Store struct{ db DB }

// NewStore returns a Store on db.
func NewStore(db DB) *Store { return &Store{db: db} }

// Save stores d, whose dead-letter topic refused it, in one INSERT, and returns its row's id. Text
// Postgres cannot hold (NUL, invalid UTF-8) is replaced, so that no error text can make it fail;
// keys, values and headers are stored as bytes, as they came.
func (s *Store) Save(ctx context.Context, d Stored) (id int64, err error) {
	names := make([][]byte, len(d.Headers))
	values := make([][]byte, len(d.Headers))
	for i, h := range d.Headers {
		names[i], values[i] = []byte(h.Key), h.Value
	}
	err = s.db.QueryRow(ctx, `
		INSERT INTO dead_letters (dlq_topic, original_topic, original_partition, original_offset,
			message_key, message_value, header_names, header_values,
			reason, error, attempts, failed_at, write_error)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
		RETURNING id`,
		text(d.DLQTopic), text(d.Letter.Topic), d.Letter.Partition, d.Letter.Offset,
		d.Key, d.Value, names, values,
		text(string(d.Letter.Reason)), text(d.Letter.Error), d.Letter.Attempts, d.Letter.FailedAt,
		text(truncate(d.WriteError, MaxErrorLen))).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("store the dead letter in dead_letters: %w", err)
	}
	return id, nil
}

// Pending calls fn with each dead letter of dlqTopic not yet replayed, oldest first, until fn
// returns false or an error.
func (s *Store) Pending(ctx context.Context, dlqTopic string, fn func(Stored) (more bool, err error)) error {
	rows, err := s.db.Query(ctx, `
		SELECT id, dlq_topic, original_topic, original_partition, original_offset,
			message_key, message_value, header_names, header_values,
			reason, error, attempts, failed_at, write_error, stored_at
		FROM dead_letters
		WHERE dlq_topic = $1 AND replayed_at IS NULL
		ORDER BY id`, dlqTopic)
	if err != nil {
		return fmt.Errorf("read the dead letters of %s in dead_letters: %w", dlqTopic, err)
	}
	defer rows.Close()
	for rows.Next() {
		var d Stored
		var names, values [][]byte
		var reason string
		err := rows.Scan(&d.ID, &d.DLQTopic, &d.Letter.Topic, &d.Letter.Partition, &d.Letter.Offset,
			&d.Key, &d.Value, &names, &values,
			&reason, &d.Letter.Error, &d.Letter.Attempts, &d.Letter.FailedAt, &d.WriteError, &d.StoredAt)
		if err != nil {
			return fmt.Errorf("read the dead letters of %s in dead_letters: %w", dlqTopic, err)
		}
		d.Letter.Reason = inboxtype.Reason(reason)
		if len(names) != len(values) {
			return fmt.Errorf("dead_letters row %d: %d header names for %d values", d.ID, len(names), len(values))
		}
		for i := range names {
			d.Headers = append(d.Headers, kafka.Header{Key: string(names[i]), Value: values[i]})
		}
		more, err := fn(d)
		if err != nil || !more {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the dead letters of %s in dead_letters: %w", dlqTopic, err)
	}
	return nil
}

// ErrReplayClaimLost is MarkReplayed's error when the row is no longer claimed by the replay: its
// claim lapsed, and another replay may have taken it, or it is marked replayed already.
var ErrReplayClaimLost = errors.New("the dead letter is no longer claimed by this replay")

// ClaimReplay claims the dead letter id for the replay owner, for lease, before it is put back on its
// topic: it reports false when the row is replayed already, or claimed by another replay whose claim
// has not lapsed. Once the write is acknowledged, MarkReplayed ends the claim; a claim that lapses
// (its replay died, or took longer than lease) lets another replay take the row. No transaction is
// held meanwhile: each is one statement.
func (s *Store) ClaimReplay(ctx context.Context, id int64, owner string, lease time.Duration) (bool, error) {
	tag, err := s.db.Exec(ctx, `
		UPDATE dead_letters SET replay_claimed_by = $2, replay_claimed_until = now() + $3 * interval '1 microsecond'
		WHERE id = $1 AND replayed_at IS NULL
			AND (replay_claimed_until IS NULL OR replay_claimed_until <= now() OR replay_claimed_by = $2)`,
		id, owner, lease.Microseconds())
	if err != nil {
		return false, fmt.Errorf("claim dead_letters row %d for a replay: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MarkReplayed records that the dead letter id, claimed by the replay owner (ClaimReplay), was put
// back on its original topic: Pending no longer returns it. It returns ErrReplayClaimLost when
// another replay has claimed it since (owner's claim lapsed), or it is marked already. The row stays, as the dead-letter topic keeps its messages, for the
// record.
func (s *Store) MarkReplayed(ctx context.Context, id int64, owner string) error {
	tag, err := s.db.Exec(ctx, `
		UPDATE dead_letters SET replayed_at = now(), replay_claimed_until = NULL
		WHERE id = $1 AND replayed_at IS NULL AND replay_claimed_by = $2`,
		id, owner)
	if err != nil {
		return fmt.Errorf("mark dead_letters row %d replayed: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark dead_letters row %d replayed: %w", id, ErrReplayClaimLost)
	}
	return nil
}

// text is s as a text column holds it: valid UTF-8 without NUL.
func text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// Place is a dead letter's place in its dead-letter topic.
type Place struct {
	Partition int
	Offset    int64
}

// Identity names the dead letter l is among all: where it came from and when it failed. A place of
// a dead-letter topic deleted and created again holds another letter, of another identity.
func (l Letter) Identity() string {
	return fmt.Sprintf("%s/%d/%d@%s", l.Topic, l.Partition, l.Offset, l.FailedAt.UTC().Format(time.RFC3339Nano))
}

// Replayed returns the letters of dlqTopic a replay put back (MarkTopicReplayed), by place, each with
// its identity.
func (s *Store) Replayed(ctx context.Context, dlqTopic string) (map[Place]string, error) {
	rows, err := s.db.Query(ctx, `
		SELECT dlq_partition, dlq_offset, letter FROM dead_letter_replays
		WHERE dlq_topic = $1 AND replayed_at IS NOT NULL`, dlqTopic)
	if err != nil {
		return nil, fmt.Errorf("read the dead letters of %s replayed before: %w", dlqTopic, err)
	}
	out := map[Place]string{}
	var p Place
	var identity string
	_, err = pgx.ForEachRow(rows, []any{&p.Partition, &p.Offset, &identity}, func() error {
		out[p] = identity
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the dead letters of %s replayed before: %w", dlqTopic, err)
	}
	return out, nil
}

// ClaimTopicReplay claims the dead letter of identity at place of dlqTopic for the replay owner, for
// lease, before it is put back on its topic, as ClaimReplay does a row of dead_letters: it reports
// false when another replay holds it, or it was replayed already and again is false. A row of
// another letter (the topic was created again) is this letter's from now on.
func (s *Store) ClaimTopicReplay(ctx context.Context, dlqTopic string, place Place, identity, owner string,
	lease time.Duration, again bool) (bool, error) {
	tag, err := s.db.Exec(ctx, `
		INSERT INTO dead_letter_replays AS r (dlq_topic, dlq_partition, dlq_offset, letter, claimed_by, claimed_until)
		VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 microsecond')
		ON CONFLICT (dlq_topic, dlq_partition, dlq_offset) DO UPDATE
		SET letter = excluded.letter, claimed_by = excluded.claimed_by, claimed_until = excluded.claimed_until,
			replayed_at = CASE WHEN r.letter = excluded.letter THEN r.replayed_at END,
			replays = CASE WHEN r.letter = excluded.letter THEN r.replays ELSE 0 END
		WHERE r.letter <> excluded.letter
			OR ((r.replayed_at IS NULL OR $7)
				AND (r.claimed_until IS NULL OR r.claimed_until <= now() OR r.claimed_by = excluded.claimed_by))`,
		dlqTopic, place.Partition, place.Offset, identity, owner, lease.Microseconds(), again)
	if err != nil {
		return false, fmt.Errorf("claim %s/%d offset %d for a replay: %w", dlqTopic, place.Partition, place.Offset, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MarkTopicReplayed records that the dead letter at place of dlqTopic, claimed by the replay owner
// (ClaimTopicReplay), was put back on its original topic. It returns ErrReplayClaimLost when another
// replay has claimed it since.
func (s *Store) MarkTopicReplayed(ctx context.Context, dlqTopic string, place Place, owner string) error {
	tag, err := s.db.Exec(ctx, `
		UPDATE dead_letter_replays SET replayed_at = now(), replays = replays + 1, claimed_until = NULL
		WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3
			AND claimed_by = $4 AND claimed_until IS NOT NULL`,
		dlqTopic, place.Partition, place.Offset, owner)
	if err != nil {
		return fmt.Errorf("mark %s/%d offset %d replayed: %w", dlqTopic, place.Partition, place.Offset, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark %s/%d offset %d replayed: %w", dlqTopic, place.Partition, place.Offset, ErrReplayClaimLost)
	}
	return nil
}
