package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// callback is one payment callback of the generated stream.
type callback struct {
	EventID       string `json:"event_id"`
	OrderNo       string `json:"order_no"`
	Provider      string `json:"provider"`
	ProviderTxnID string `json:"provider_txn_id"`
	Amount        string `json:"amount"`
	Currency      string `json:"currency"`
	Result        string `json:"result"`
	PaidAt        string `json:"paid_at"`
}

// stream is n payment callbacks of which a share are redeliveries of earlier ones, as Kafka
// delivers them after a crash or a provider resends them after a timeout. It is computed, not
// stored, so that memory does not grow with n outside the code under measurement.
type stream struct {
	n      int
	unique int // distinct callbacks, one per order
	every  int // every every-th message is a redelivery
	// signing signs each message as a provider would, the idempotency key its webhook-id.
	signing signing
}

func newStream(n int, redeliveries float64) stream {
	every := n + 1
	if redeliveries > 0 {
		every = max(2, int(1/redeliveries+0.5))
	}
	return stream{n: n, unique: n - n/every, every: every}
}

var paidAt = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Format(time.RFC3339)

// callback returns distinct callback i.
func (s stream) callback(i int) callback {
	return callback{
		EventID:       fmt.Sprintf("evt-%08d", i),
		OrderNo:       fmt.Sprintf("ORD-%08d", i),
		Provider:      "alipay",
		ProviderTxnID: fmt.Sprintf("TXN-%08d", i),
		Amount:        fmt.Sprintf("%d.%02d", 10+i%990, i%100),
		Currency:      "CNY",
		Result:        "SUCCESS",
		PaidAt:        paidAt,
	}
}

// message returns message j of the stream: a new callback, or, for every every-th message, a
// redelivery of one sent earlier.
func (s stream) message(j int) kafka.Message {
	sent := j - j/s.every // distinct callbacks sent before message j
	i := sent
	if (j+1)%s.every == 0 {
		i = (j * 7919) % sent
	}
	c := s.callback(i)
	value, _ := json.Marshal(c)
	if s.signing != unsigned {
		return kafka.Message{Key: []byte(c.OrderNo), Value: value, Headers: s.signing.headers(c.EventID, value)}
	}
	return kafka.Message{
		Key:     []byte(c.OrderNo),
		Value:   value,
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(c.EventID)}},
	}
}

// produce writes the stream to topic.
func (s stream) produce(ctx context.Context, addr, topic string) error {
	transport := &kafka.Transport{}
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(addr),
		Topic:        topic,
		Transport:    transport,
		Balancer:     &kafka.Hash{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    1000,
		BatchBytes:   4 << 20,
		BatchTimeout: time.Millisecond,
	}
	defer w.Close()
	const chunk = 5_000
	batch := make([]kafka.Message, 0, chunk)
	for j := 0; j < s.n; j += chunk {
		batch = batch[:0]
		for k := j; k < min(j+chunk, s.n); k++ {
			batch = append(batch, s.message(k))
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			return fmt.Errorf("produce to %s: %w", topic, err)
		}
	}
	return nil
}

// createOrders inserts the PENDING orders the callbacks pay.
func (s stream) createOrders(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"orders"},
		[]string{"order_no", "user_id", "amount", "currency", "status"},
		pgx.CopyFromFunc(s.rows(func(c callback) []any {
			return []any{c.OrderNo, "user-1", c.Amount, c.Currency, "PENDING"}
		})))
	return err
}

// rows returns a pgx.CopyFromFunc source of one row per distinct callback.
func (s stream) rows(row func(callback) []any) func() ([]any, error) {
	i := 0
	return func() ([]any, error) {
		if i == s.unique {
			return nil, nil
		}
		i++
		return row(s.callback(i - 1)), nil
	}
}
