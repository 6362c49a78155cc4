package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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
// delivers them after a crash or a provider resends them after a timeout.
type stream struct {
	unique   []callback      // one per order
	messages []kafka.Message // in produce order, redeliveries included
}

func newStream(n int, redeliveries float64, seed uint64) *stream {
	rng := rand.New(rand.NewPCG(seed, seed))
	nUnique := n - int(float64(n)*redeliveries)
	s := &stream{}
	paidAt := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Format(time.RFC3339)
	for i := range nUnique {
		s.unique = append(s.unique, callback{
			EventID:       fmt.Sprintf("evt-%08d", i),
			OrderNo:       fmt.Sprintf("ORD-%08d", i),
			Provider:      "alipay",
			ProviderTxnID: fmt.Sprintf("TXN-%08d", i),
			Amount:        fmt.Sprintf("%d.%02d", 10+i%990, i%100),
			Currency:      "CNY",
			Result:        "SUCCESS",
			PaidAt:        paidAt,
		})
	}
	for i := range n {
		c := s.unique[i%nUnique]
		if i >= nUnique { // a redelivery of an earlier message
			c = s.unique[rng.IntN(nUnique)]
		}
		value, _ := json.Marshal(c)
		s.messages = append(s.messages, kafka.Message{
			Key:     []byte(c.OrderNo),
			Value:   value,
			Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(c.EventID)}},
		})
	}
	// Redeliveries arrive among the rest, not all at the end.
	rng.Shuffle(len(s.messages), func(i, j int) { s.messages[i], s.messages[j] = s.messages[j], s.messages[i] })
	return s
}

// produce writes the stream to topic.
func (s *stream) produce(ctx context.Context, addr, topic string) error {
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
	const chunk = 10_000
	for i := 0; i < len(s.messages); i += chunk {
		if err := w.WriteMessages(ctx, s.messages[i:min(i+chunk, len(s.messages))]...); err != nil {
			return fmt.Errorf("produce to %s: %w", topic, err)
		}
	}
	return nil
}

// createOrders inserts the PENDING orders the callbacks pay.
func (s *stream) createOrders(ctx context.Context, pool *pgxpool.Pool) error {
	rows := make([][]any, len(s.unique))
	for i, c := range s.unique {
		rows[i] = []any{c.OrderNo, "user-1", c.Amount, c.Currency, "PENDING"}
	}
	_, err := pool.CopyFrom(ctx, pgx.Identifier{"orders"},
		[]string{"order_no", "user_id", "amount", "currency", "status"}, pgx.CopyFromRows(rows))
	return err
}
