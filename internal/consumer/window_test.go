package consumer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
)

// windowStep is one thing a test asks of a window, as the partition's steps do, with what it is to
// answer; its constructors below name them.
type windowStep struct {
	name string
	do   func(w *window, at map[int64]*entry) any
	want any
}

// startEach starts, as schedule starts messages one by one, every message the window yields as
// startable before barrier, and wants the offsets started.
func startEach(barrier int64, want ...int64) windowStep {
	return windowStep{name: fmt.Sprintf("startEach(%d)", barrier), want: want,
		do: func(w *window, _ map[int64]*entry) any {
			var started []int64
			for e := range w.startable(barrier) {
				w.start(e)
				started = append(started, e.msg.Offset)
			}
			return started
		}}
}

// startBatch collects, as schedule forms a batch, up to size startable messages before starting
// them, and wants the offsets started.
func startBatch(size int, want ...int64) windowStep {
	return windowStep{name: fmt.Sprintf("startBatch(%d)", size), want: want,
		do: func(w *window, _ map[int64]*entry) any {
			var batch []*entry
			for e := range w.startable(noBarrier) {
				batch = append(batch, e)
				if len(batch) == size {
					break
				}
			}
			var started []int64
			for _, e := range batch {
				w.start(e)
				started = append(started, e.msg.Offset)
			}
			return started
		}}
}

// unstart undoes the start of the dispatch of the messages at offsets.
func unstart(offsets ...int64) windowStep {
	return windowStep{name: fmt.Sprintf("unstart%v", offsets),
		do: func(w *window, at map[int64]*entry) any {
			for _, o := range offsets {
				w.unstart(at[o])
			}
			return nil
		}}
}

// settle settles the dispatch of the messages at offsets, its first finished ones finished.
func settle(finished int, offsets ...int64) windowStep {
	return windowStep{name: fmt.Sprintf("settle(%d, %v)", finished, offsets),
		do: func(w *window, at map[int64]*entry) any {
			var entries []*entry
			for _, o := range offsets {
				entries = append(entries, at[o])
			}
			w.settle(entries, finished)
			return nil
		}}
}

// committed is what dropFinished answers.
type committed struct {
	offset  int64
	dropped int
}

// commit drops the finished messages a commit covers and wants its offset and how many it dropped.
func commit(offset int64, dropped int) windowStep {
	return windowStep{name: "commit", want: committed{offset, dropped},
		do: func(w *window, _ map[int64]*entry) any {
			o, n := w.dropFinished()
			return committed{o, n}
		}}
}

// windowCounts are a window's counts, and its first unfinished and unstarted messages (-1: none).
type windowCounts struct {
	inFlight, unstarted, finished   int
	allFinished                     bool
	firstUnfinished, firstUnstarted int64
}

// counts wants the window's counts.
func counts(inFlight, unstarted, finished int, firstUnfinished, firstUnstarted int64) windowStep {
	want := windowCounts{inFlight: inFlight, unstarted: unstarted, finished: finished,
		allFinished: finished == inFlight, firstUnfinished: firstUnfinished, firstUnstarted: firstUnstarted}
	return windowStep{name: "counts", want: want,
		do: func(w *window, _ map[int64]*entry) any {
			offset := func(e *entry) int64 {
				if e == nil {
					return -1
				}
				return e.msg.Offset
			}
			return windowCounts{inFlight: w.inFlight(), unstarted: w.unstarted(), finished: w.finished(),
				allFinished: w.allFinished(), firstUnfinished: offset(w.firstUnfinished()),
				firstUnstarted: offset(w.firstUnstarted())}
		}}
}

// TestWindow runs the partition's questions to its window through scripts: messages fetched at
// offsets 10, 11, … with the Kafka keys given ("" for none: ordered by the idempotency key, here
// evt-<offset>), under an ordering, then steps in turn, each answer checked.
func TestWindow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		ordering Ordering
		keys     []string
		steps    []windowStep
	}{
		{name: "Empty", steps: []windowStep{counts(0, 0, 0, -1, -1), startEach(noBarrier), commit(0, 0)}},
		// The first message of every key starts; a key's later messages wait until it settles.
		{name: "ByKeyNextOfEachKey", keys: []string{"a", "b", "a", "c", "b", "a"}, steps: []windowStep{
			counts(6, 6, 0, 10, 10),
			startEach(noBarrier, 10, 11, 13),
			counts(6, 3, 0, 10, 12),
			startEach(noBarrier), // every key has a message in flight
			settle(1, 11),
			startEach(noBarrier, 14),
			settle(1, 10),
			startEach(noBarrier, 12),
			counts(6, 1, 2, 12, 15),
		}},
		// Messages without a Kafka key are ordered by their idempotency key: each its own.
		{name: "ByKeyWithoutKafkaKeys", keys: []string{"", "", "a", ""}, steps: []windowStep{
			startEach(noBarrier, 10, 11, 12, 13),
		}},
		// ByPartition: one message of the partition at a time, in offset order, whatever its key.
		{name: "ByPartition", ordering: ByPartition, keys: []string{"a", "b", "", "c"}, steps: []windowStep{
			startEach(noBarrier, 10),
			startEach(noBarrier),
			settle(1, 10),
			startEach(noBarrier, 11),
			settle(1, 11),
			commit(12, 2),
			startEach(noBarrier, 12),
			counts(2, 1, 0, 12, 13),
		}},
		// A batch takes the startable messages and their keys' later ones, in offset order.
		{name: "ByKeyBatches", keys: []string{"a", "a", "b", "a", "c", "b", "d"}, steps: []windowStep{
			startBatch(4, 10, 11, 12, 13),
			startBatch(4, 14, 16), // c and d: a and b are in flight
			startBatch(4),
			settle(4, 10, 11, 12, 13),
			counts(7, 1, 4, 14, 15),
			startBatch(4, 15),
		}},
		// ByPartition batches are runs of consecutive messages, one in flight at a time.
		{name: "ByPartitionBatches", ordering: ByPartition, keys: []string{"a", "b", "c", "d", "e"}, steps: []windowStep{
			startBatch(2, 10, 11),
			startBatch(2),
			settle(2, 10, 11),
			startBatch(2, 12, 13),
		}},
		// Nothing at or after the barrier starts, not even a free key's message.
		{name: "Barrier", keys: []string{"a", "b", "c", "d"}, steps: []windowStep{
			startEach(-1),
			startEach(12, 10, 11),
			startEach(noBarrier, 12, 13),
		}},
		// Settled out of order: the commit covers only the contiguous finished messages at the
		// window's start, and drops them.
		{name: "OutOfOrderSettles", keys: []string{"a", "b", "c", "d"}, steps: []windowStep{
			startEach(noBarrier, 10, 11, 12, 13),
			settle(1, 12),
			settle(1, 13),
			counts(4, 0, 0, 10, -1),
			commit(0, 0),
			settle(1, 10),
			counts(4, 0, 1, 11, -1),
			commit(11, 1),
			commit(0, 0), // nothing finished since
			settle(1, 11),
			counts(3, 0, 3, -1, -1),
			commit(14, 3),
			counts(0, 0, 0, -1, -1),
		}},
		// A commit leaves the later messages as they were: after it, the window goes on.
		{name: "CommitThenMore", keys: []string{"a", "a", "b"}, steps: []windowStep{
			startEach(noBarrier, 10, 12),
			settle(1, 10),
			commit(11, 1),
			startEach(noBarrier, 11),
			settle(1, 11),
			counts(2, 0, 1, 12, -1),
			settle(1, 12),
			commit(13, 2),
		}},
		// An abandoned message stays started and unfinished: never yielded again, and no commit
		// passes it, so that it is delivered again.
		{name: "Abandoned", keys: []string{"a", "b", "c"}, steps: []windowStep{
			startEach(noBarrier, 10, 11, 12),
			settle(0, 10),
			settle(1, 11),
			startEach(noBarrier),
			counts(3, 0, 0, 10, -1),
			commit(0, 0),
			settle(1, 12),
			commit(0, 0),
			counts(3, 0, 0, 10, -1),
		}},
		// An abandoned message keeps its key in flight: the key's later messages wait for its
		// redelivery instead of overtaking it; other keys go on.
		{name: "AbandonedKeyWaits", keys: []string{"a", "a", "b", "b"}, steps: []windowStep{
			startEach(noBarrier, 10, 12),
			settle(0, 10),
			settle(1, 12),
			startEach(noBarrier, 13),
		}},
		// A batch abandoned after its first messages finished: those count, the rest do not; the
		// key of a message abandoned after one of its key finished stays in flight.
		{name: "BatchAbandonedKeyWaits", keys: []string{"a", "a", "a", "b"}, steps: []windowStep{
			startBatch(2, 10, 11),
			settle(1, 10, 11),
			startEach(noBarrier, 13),
		}},
		// A batch abandoned after its first messages finished: those count, the rest do not.
		{name: "BatchPartlyAbandoned", keys: []string{"a", "b", "a", "c"}, steps: []windowStep{
			startBatch(4, 10, 11, 12, 13),
			settle(2, 10, 11, 12, 13),
			counts(4, 0, 2, 12, -1),
			commit(12, 2),
			startEach(noBarrier),
			counts(2, 0, 0, 12, -1),
		}},
		// A dispatch that will not start after all is unstarted: its messages start again.
		{name: "Unstarted", keys: []string{"a", "a", "b"}, steps: []windowStep{
			startEach(noBarrier, 10, 12),
			unstart(10),
			unstart(12),
			counts(3, 3, 0, 10, 10),
			startBatch(3, 10, 11, 12),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var w window
			at := make(map[int64]*entry)
			for i, k := range c.keys {
				m := kafka.Message{Offset: int64(10 + i)}
				if k != "" {
					m.Key = []byte(k)
				}
				key := fmt.Sprintf("evt-%d", m.Offset)
				e := &entry{msg: m, key: key, order: orderingKey(c.ordering, m, key, nil)}
				w.add(e)
				at[m.Offset] = e
			}
			for i, s := range c.steps {
				got := s.do(&w, at)
				if s.want != nil && !equalAnswer(got, s.want) {
					t.Fatalf("step %d, %s: got %v, want %v", i, s.name, got, s.want)
				}
			}
		})
	}
}

// equalAnswer reports whether a step's answer is the one wanted: offsets (nil and none alike), or
// any comparable answer.
func equalAnswer(got, want any) bool {
	if offsets, ok := want.([]int64); ok {
		return slices.Equal(got.([]int64), offsets)
	}
	return got == want
}

// TestOrderingKey is the ordering key of a message under each ordering: its Kafka key, else its
// idempotency key, else its own, by kind never one for another; with ByPartition the partition's.
func TestOrderingKey(t *testing.T) {
	t.Parallel()
	errNoKey := fmt.Errorf("no idempotency key")
	for _, c := range []struct {
		name     string
		ordering Ordering
		kafkaKey string
		key      string
		keyErr   error
		want     string
	}{
		{name: "KafkaKey", kafkaKey: "A-1", key: "evt-1", want: "kA-1"},
		{name: "KafkaKeyWithoutIdempotencyKey", kafkaKey: "A-1", keyErr: errNoKey, want: "kA-1"},
		{name: "IdempotencyKey", key: "A-1", want: "iA-1"},
		{name: "Neither", keyErr: errNoKey, want: "o7"},
		{name: "ByPartition", ordering: ByPartition, kafkaKey: "A-1", key: "evt-1", want: ""},
		{name: "ByPartitionNeither", ordering: ByPartition, keyErr: errNoKey, want: ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := kafka.Message{Offset: 7}
			if c.kafkaKey != "" {
				m.Key = []byte(c.kafkaKey)
			}
			if got := orderingKey(c.ordering, m, c.key, c.keyErr); got != c.want {
				t.Errorf("orderingKey = %q, want %q", got, c.want)
			}
		})
	}
}
