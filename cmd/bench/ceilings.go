package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// runKafka consumes the stream with kafka-go as the worker does (a consumer group, one reader per
// partition, a synchronous offset commit per 500 messages) and does nothing else: the Kafka ceiling.
func runKafka(ctx context.Context, e *env) (result, error) {
	ends, err := endOffsets(ctx, e.addr, e.topic, e.cfg.Partitions)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                "bench-kafka",
		Brokers:           []string{e.addr},
		Topics:            []string{e.topic},
		StartOffset:       kafka.FirstOffset,
		HeartbeatInterval: time.Second,
		SessionTimeout:    10 * time.Second,
	})
	if err != nil {
		return result{}, err
	}
	defer group.Close()
	gen, err := group.Next(ctx)
	if err != nil {
		return result{}, err
	}

	var (
		wg        sync.WaitGroup
		latencies = newReservoir(10_000)
		errs      = make(chan error, e.cfg.Partitions)
	)
	for _, a := range gen.Assignments[e.topic] {
		wg.Go(func() {
			if err := consumePartition(ctx, e, gen, a, ends[a.ID], latencies); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return result{}, err
	}
	return result{Elapsed: elapsed, Messages: latencies.seen, Latencies: latencies}, nil
}

func consumePartition(ctx context.Context, e *env, gen *kafka.Generation, a kafka.PartitionAssignment,
	end int64, latencies *reservoir) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   []string{e.addr},
		Topic:     e.topic,
		Partition: a.ID,
		MaxWait:   500 * time.Millisecond,
		MaxBytes:  10 << 20,
	})
	defer r.Close()
	offset := a.Offset
	if offset < 0 {
		offset = kafka.FirstOffset
	}
	if err := r.SetOffset(offset); err != nil {
		return err
	}
	const commitEvery = 500
	fetched := make([]time.Time, 0, commitEvery)
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return err
		}
		fetched = append(fetched, time.Now())
		last := m.Offset+1 >= end
		if len(fetched) < commitEvery && !last {
			continue
		}
		if err := gen.CommitOffsets(map[string]map[int]int64{e.topic: {a.ID: m.Offset + 1}}); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		now := time.Now()
		for _, t := range fetched {
			latencies.add(now.Sub(t))
		}
		fetched = fetched[:0]
		if last {
			return nil
		}
	}
}

func endOffsets(ctx context.Context, addr, topic string, partitions int) (map[int]int64, error) {
	ends := make(map[int]int64, partitions)
	for p := range partitions {
		conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, p)
		if err != nil {
			return nil, err
		}
		ends[p], err = conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			return nil, err
		}
	}
	return ends, nil
}

// runCopy writes the rows the worker would write for the stream's distinct callbacks, the inbox row
// and the payments row of each, with COPY in one transaction: the Postgres ceiling.
func runCopy(ctx context.Context, e *env) (result, error) {
	s := e.stream
	expires := time.Now().Add(72 * time.Hour)
	fingerprint := inbox.Fingerprint(s.message(0).Value)
	start := time.Now()
	err := inbox.WithTx(ctx, e.pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"inbox"},
			[]string{"handler", "idempotency_key", "fingerprint", "topic", "partition", "offset", "expires_at"},
			pgx.CopyFromFunc(s.rows(func(c callback) []any {
				return []any{"payments", c.EventID, fingerprint[:], e.topic, int32(0), int64(0), expires}
			}))); err != nil {
			return err
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"},
			[]string{"provider", "provider_txn_id", "order_no", "amount", "currency", "result", "idempotency_key"},
			pgx.CopyFromFunc(s.rows(func(c callback) []any {
				return []any{c.Provider, c.ProviderTxnID, c.OrderNo, c.Amount, c.Currency, c.Result, c.EventID}
			})))
		return err
	})
	if err != nil {
		return result{}, err
	}
	return result{Elapsed: time.Since(start), Messages: e.cfg.N}, nil
}
