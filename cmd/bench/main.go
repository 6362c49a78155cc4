// Command bench measures end-to-end payment-callback throughput on an embedded Kafka broker and the
// local Postgres, and compares the worker's processing modes side by side with two ceilings:
//
//	kafka    kafka-go consuming and committing with no database work (the Kafka ceiling)
//	message  the worker with one transaction per message (the established inbox design)
//	batch    the worker with one transaction per batch of a partition's messages
//	copy     the same inbox and payments rows written by COPY (the Postgres ceiling)
//	sms      the worker with the SMS handler, sending to a provider that answers after a set latency
//	         (-provider-latency), one event to each of -phones phones (not run by default)
//	sms_rate the sms stream through -instances workers of one group under -sms-rate-limit
//	         (SMS_RATE_LIMIT): the rate the provider saw and its busiest second (not run by default)
//
// and, each with a stream of its own (see parking.go), what a stuck message or a dependency's outage
// costs: overtake, provider_outage and postgres_outage.
//
// Each mode gets the same stream (N callbacks, a share of them redeliveries), produced before the
// clock starts, a fresh topic and a fresh database schema; the clock runs from the start of the
// consumer to its last offset commit.
//
//	go run ./cmd/bench -n 50000
//	go run ./cmd/bench -modes sms -provider-latency 100ms -phones 2000
//	go run ./cmd/bench -modes sms_rate -sms-rate-limit 100 -instances 2 -provider-latency 20ms -phones 3000
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if spec := os.Getenv(brokerEnv); spec != "" {
		if err := runBroker(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench broker:", err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	flag.IntVar(&cfg.N, "n", 50_000, "messages per mode, redeliveries included")
	flag.Float64Var(&cfg.Redeliveries, "redeliveries", 0.10, "share of messages that are redeliveries")
	flag.IntVar(&cfg.Partitions, "partitions", 4, "partitions of the payments topic")
	flag.StringVar(&cfg.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres to measure against (a schema per mode is created and dropped)")
	flag.StringVar(&cfg.PooledURL, "pooled-url", "",
		"payment modes: the worker connects through this URL instead, a connection pooler in transaction mode in front of "+
			"-database-url's server, as a role the bench sets search_path on (docs/benchmarks.md)")
	modes := flag.String("modes", "kafka,message,batch,copy", "modes to run, in order")
	flag.IntVar(&cfg.BatchSize, "batch-size", 256, "the worker's BATCH_SIZE: most messages of a partition per batch")
	flag.DurationVar(&cfg.BatchWait, "batch-wait", 5*time.Millisecond, "the worker's BATCH_WAIT: how long a batch waits for more messages")
	maxConns := flag.Int("max-conns", 0, "database connections of the worker (default: partitions + 2, at least 4)")
	flag.IntVar(&cfg.Phones, "phones", 2_000, "sms mode: events, each to its own phone")
	flag.DurationVar(&cfg.ProviderLatency, "provider-latency", 100*time.Millisecond, "sms mode: how long the SMS provider takes to answer")
	flag.StringVar(&cfg.SMSRecipientLimit, "sms-recipient-limit", "",
		"sms mode: the worker's SMS_RECIPIENT_LIMIT, e.g. verify_code=1/1m;5/1h;10/24h (each event is to its own phone: none is over it)")
	flag.Float64Var(&cfg.SMSRateLimit, "sms-rate-limit", 100, "sms_rate mode: the worker's SMS_RATE_LIMIT, calls per second for the whole group")
	flag.IntVar(&cfg.Instances, "instances", 2, "sms_rate mode: workers in the group")
	flag.BoolVar(&cfg.OnePartition, "one-partition", false, "sms_rate mode: the whole stream on partition 0, all the traffic on one instance")
	flag.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of the timed part of each mode to `file`.<mode>")
	cfg.LogLevel = slog.LevelWarn
	flag.TextVar(&cfg.LogLevel, "log-level", cfg.LogLevel,
		"level of the worker's log, as JSON lines on stderr (info: a line per applied payment, as the worker logs by default)")
	flag.BoolVar(&cfg.LogOutcomes, "log-outcomes", true, "the worker's LOG_OUTCOMES: false logs the line of each applied payment at debug")
	flag.Parse()
	cfg.MaxConns = int32(cmp.Or(*maxConns, max(4, cfg.Partitions+2)))
	cfg.Modes = strings.Split(*modes, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
