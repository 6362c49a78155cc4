package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Where a partition reads on when its position is no longer in its log. Nothing is skipped in
// silence, and nothing waits for an offset the log will reach only with other records:
//
//   - below the log start (retention, or DeleteRecords, took records before the group read them):
//     on from the first record, with an ERROR naming the range skipped and the records counted
//     (inboxworker_records_skipped_total);
//   - past the log end (the topic re-created under the same ID, or truncated): back to the group's
//     committed offset if it is within the log, else the first record, with an ERROR;
//   - the topic deleted and re-created (its ID changed): its partition from the first record, with
//     an ERROR: every record of the new topic is new.
//
// The last two go back: the partition's window, whose offsets are of the old log, is dropped once
// its dispatches have settled, and nothing of it is committed (see partition.rewind). Records read
// again are found in the inbox: nothing is applied twice.

// leftTheLog reports whether err says the reader's position is no longer in the partition's log.
func leftTheLog(err error) bool {
	return errors.Is(err, kerr.OffsetOutOfRange) || errors.Is(err, kerr.UnknownTopicID)
}

// reposition returns a reader of the partition from where it reads on after its reader's position
// left the log (cause), and whether that goes back. It says why, once. It retries every second
// while the log's offsets cannot be read (a topic deleted and not created again); it returns nil
// when ctx is done first.
func (p *partition) reposition(ctx context.Context, old *reader, cause error) (next *reader, back bool) {
	for {
		from, back, err := p.readOnFrom(ctx, old.position, cause)
		if err == nil {
			if next, err = p.c.newReader(p.topic, p.id, from, p.log); err == nil {
				return next, back
			}
		}
		if ok, since := p.fetchWarnings.say("reposition", time.Now()); ok {
			p.log.Warn("cannot read the partition's offsets to read on from; retrying",
				"offset", old.position, "cause", cause, "error", err, "repeated", since)
		}
		if p.sleep(ctx, time.Second) != nil {
			return nil, false
		}
	}
}

// readOnFrom decides where the partition reads on from, its position (the next offset to read)
// having left the log for cause, and logs why.
func (p *partition) readOnFrom(ctx context.Context, position int64, cause error) (from int64, back bool, err error) {
	start, end, err := p.c.logRange(ctx, p.topic, p.id)
	if err != nil {
		return 0, false, err
	}
	switch {
	case errors.Is(cause, kerr.UnknownTopicID):
		p.log.Error("the topic was deleted and created again: reading its partition from the first record",
			"offset", position, "from", start, "end", end)
		return start, true, nil
	case position >= 0 && position < start:
		p.log.Error("records were deleted before the group read them (retention, or DeleteRecords): skipping them",
			"first_skipped", position, "last_skipped", start-1, "skipped", start-position)
		p.c.metrics.skipped(p.topic, start-position)
		return start, false, nil
	case position > end:
		committed, err := p.c.lag.committed(ctx, map[string][]int{p.topic: {p.id}})
		if err != nil {
			return 0, false, err
		}
		from, source := start, "first record"
		if c, ok := committed[topicPartition{p.topic, p.id}]; ok && c >= start && c <= end {
			from, source = c, "committed offset"
		}
		p.log.Error("the partition's log ends before the offset to read: the topic was created again or truncated; reading again from the group's committed offset, or the first record",
			"offset", position, "end", end, "from", from, "from_the", source)
		return from, true, nil
	}
	return max(position, start), false, nil // back in the log meanwhile
}

// logRange returns the first and the end offset of topic's partition.
func (c *Consumer) logRange(ctx context.Context, topic string, partition int) (start, end int64, err error) {
	resp, err := c.lag.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{topic: {kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition)}},
	})
	if err != nil {
		return 0, 0, fmt.Errorf("list offsets: %w", err)
	}
	for _, po := range resp.Topics[topic] {
		if po.Partition != partition {
			continue
		}
		if po.Error != nil {
			return 0, 0, fmt.Errorf("list offsets: %w", po.Error)
		}
		return po.FirstOffset, po.LastOffset, nil
	}
	return 0, 0, fmt.Errorf("list offsets: no answer for %s/%d", topic, partition)
}

// rewind drops the partition's window, whose offsets are of a log it no longer reads, once its
// dispatches have settled: nothing of it is committed (its messages are in the inbox, and found
// there if read again), the crash guard's ranges are released, and the partition starts again as
// if newly assigned, at the records the fetcher reads next.
func (p *partition) rewind(ctx context.Context) {
	for range p.window.inFlight() {
		<-p.room
	}
	<-p.room // the rewind's own
	p.window = window{}
	p.committed, p.failedCommit = -1, -1
	p.guard.release(ctx)
	p.guard = newCrashGuard(p)
	p.rewinding = false
}
