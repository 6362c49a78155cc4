package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The commit step: the offset after the highest contiguous finished message of a partition,
// committed in the generation that assigned it, at most every commitInterval while messages are in
// flight. A commit that fails is tried again after commitRetry (or covered by the next one, if
// sooner), so that what finished is committed once the broker takes commits again; it is never
// silent: it is logged with the broker's error, counted, and commits failing for
// CommitFailureTimeout without a success make the consumer not ready (commitHealth).

// commitRetry is how long after a failed commit its offset is committed again when nothing else
// finished meanwhile.
const commitRetry = time.Second

// commitTimeout bounds an offset commit, as kafka-go bounds its group requests.
const commitTimeout = 5 * time.Second

// commitDue says whether the offset is to be committed now, or else how long until it will be.
func (p *partition) commitDue(draining bool) (bool, time.Duration) {
	if p.window.finished() == 0 {
		if p.failedCommit <= p.committed {
			return false, 0
		}
		if since := time.Since(p.lastCommit); since < commitRetry && !draining {
			return false, commitRetry - since
		}
		return true, 0
	}
	if draining || p.window.allFinished() {
		return true, 0
	}
	since := time.Since(p.lastCommit)
	if since >= commitInterval {
		return true, 0
	}
	return false, commitInterval - since
}

// commit commits the offset after the highest contiguous finished message, in the generation that
// assigned the partition, and drops the finished messages from the window; with none finished, it
// commits again an offset whose commit failed. A commit that fails is tried again (commitDue); if
// the partition is released first, the messages since the last commit are delivered again and
// found in the inbox.
func (p *partition) commit() {
	offset, n := p.window.dropFinished()
	if n == 0 {
		if p.failedCommit > p.committed {
			p.lastCommit = time.Now()
			p.commitOffset(p.failedCommit)
		}
		return
	}
	p.lastCommit = time.Now()
	defer func() {
		for range n {
			<-p.room // the fetcher may fetch as many more
		}
	}()
	p.commitOffset(offset)
}

// commitOffset commits offset, the next to consume, and records how it went.
func (p *partition) commitOffset(offset int64) {
	if hook := p.c.beforeOffsetCommit; hook != nil {
		hook(p.topic, p.id, offset)
	}
	err := p.commitToBroker(offset)
	p.c.commits.result(err)
	if err != nil {
		p.c.metrics.commitFailed(p.topic)
		p.commitFailures++
		if ok, since := p.commitWarnings.say("commit", time.Now()); ok {
			p.log.Warn("cannot commit the offset; messages from the last commit on will be delivered again",
				"offset", offset, "error", commitError(err), "failures", p.commitFailures, "repeated", since)
		}
		p.failedCommit = offset
		return
	}
	if p.commitFailures > 0 {
		p.log.Info("committing the offset again", "offset", offset, "failures", p.commitFailures)
		p.commitFailures = 0
		p.commitWarnings.forget("commit")
	}
	p.committed = offset
	p.log.Debug("committed the offset", "offset", offset)
	if o := p.c.config.Observer; o != nil {
		o.Committed(p.topic, p.id, offset)
	}
}

// commitToBroker commits offset in the generation that assigned the partition. It is sent on the
// consumer's own client (Consumer.committer), not on the generation's connection, which kafka-go's
// Generation.CommitOffsets would use: a broker that closes the connection of a commit it refuses
// would take the generation's heartbeats with it, and the consumer would leave its group and rejoin
// at every commit. A commit the broker answers with the generation over (a rebalance, a member it
// no longer knows) fails here; the heartbeats end the generation.
func (p *partition) commitToBroker(offset int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation, req.MemberID = p.gen.GroupID, p.gen.ID, p.gen.MemberID
	t := kmsg.NewOffsetCommitRequestTopic()
	t.Topic = p.topic
	part := kmsg.NewOffsetCommitRequestTopicPartition()
	part.Partition, part.Offset = int32(p.id), offset
	t.Partitions = append(t.Partitions, part)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, p.c.committer)
	if err != nil {
		return err
	}
	for _, t := range resp.Topics {
		for _, part := range t.Partitions {
			if part.ErrorCode != 0 {
				return kafka.Error(part.ErrorCode)
			}
		}
	}
	return nil
}

// commitError is err as a failed commit's log entry tells it: the broker's error, named, or what
// became of the connection.
func commitError(err error) error {
	var code kafka.Error
	switch {
	case errors.As(err, &code):
		return fmt.Errorf("the broker refused the commit: %s (%w)", code.Title(), err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the broker closed the connection without an answer (as a Kafka 4 broker does to a request version it no longer serves, and a broker going away does): %w", err)
	}
	return err
}

// commitHealth is whether a consumer's offset commits go through: since when they have failed,
// none succeeding since. It is safe for concurrent use.
type commitHealth struct {
	timeout time.Duration
	mu      sync.Mutex
	since   time.Time // zero while the last commit succeeded
}

// result records a commit's result.
func (h *commitHealth) result(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil:
		h.since = time.Time{}
	case h.since.IsZero():
		h.since = time.Now()
	}
}

// failing reports whether commits have failed for the timeout, none succeeding.
func (h *commitHealth) failing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.since.IsZero() && time.Since(h.since) >= h.timeout
}
