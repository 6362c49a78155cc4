package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inboxworker/inboxworker/internal/busiest"
	"github.com/inboxworker/inboxworker/internal/consumer"
	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/inbox"
	"github.com/inboxworker/inboxworker/internal/notify"
)

// runSMSRate is the sms_rate mode: the sms mode's stream, cfg.Phones events, consumed by
// cfg.Instances workers of one group whose SMS route has the rate limit cfg.SMSRateLimit for the
// group (SMS_RATE_LIMIT). It reports the rate the provider saw, from its first call to its last,
// against the limit, and the busiest second, and checks that every message made one call.
func runSMSRate(ctx context.Context, e *env) (result, error) {
	if err := produceSMS(ctx, e.cfg, e.addr, e.topic); err != nil {
		return result{}, err
	}
	ends, err := endOffsets(ctx, e.addr, e.topic, e.cfg.Partitions)
	if err != nil {
		return result{}, err
	}
	provider, err := startTimedProvider(e.cfg.ProviderLatency)
	if err != nil {
		return result{}, err
	}
	defer provider.close()
	progress := newProgress(e.topic, ends)
	consumers, err := rateLimitedConsumers(e, provider.url, progress)
	if err != nil {
		return result{}, err
	}
	if _, err := consumeAllOf(ctx, consumers, progress); err != nil {
		return result{}, err
	}
	if err := provider.check(e.cfg.Phones); err != nil {
		return result{}, err
	}
	took, most := provider.pace()
	r := result{Elapsed: took, Messages: e.cfg.Phones, Latencies: progress.latencies}
	r.Note = fmt.Sprintf("sms_rate: %d instances, SMS_RATE_LIMIT=%g, provider latency %s, %d phones: "+
		"%.1f calls/s = %.3f × the limit, from the first call to the last; the busiest second %d calls = %.2f × the limit",
		e.cfg.Instances, e.cfg.SMSRateLimit, e.cfg.ProviderLatency, e.cfg.Phones, r.rate(),
		r.rate()/e.cfg.SMSRateLimit, most, float64(most)/e.cfg.SMSRateLimit)
	return r, nil
}

// rateLimitedConsumers returns cfg.Instances consumers of one group, each with the SMS handler
// sending to providerURL under the group's rate limit, as as many worker processes would.
func rateLimitedConsumers(e *env, providerURL string, progress *progress) ([]*consumer.Consumer, error) {
	log := e.cfg.workerLogger()
	out := make([]*consumer.Consumer, e.cfg.Instances)
	for i := range out {
		store, err := inbox.NewStore(e.pool, inbox.Config{Logger: log})
		if err != nil {
			return nil, err
		}
		sender, err := notify.NewHTTPSender(notify.HTTPConfig{URL: providerURL,
			Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}})
		if err != nil {
			return nil, err
		}
		handler, err := notify.NewHandler(notify.Config{Sender: sender, Logger: log})
		if err != nil {
			return nil, err
		}
		out[i], err = consumer.New(consumer.Config{
			Brokers: []string{e.addr},
			GroupID: "bench-sms-rate",
			Routes: []consumer.Route{{Topic: e.topic, Name: "sms", Call: handler, Concurrency: 128,
				RateLimit: e.cfg.SMSRateLimit}},
			DeadLetters: deadletter.NewStore(e.pool),
			Store:       store,
			Metrics:     consumer.NewMetrics(prometheus.NewRegistry()),
			Logger:      log,
			Observer:    progress,
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// consumeAllOf runs consumers until progress says every partition is committed to its end, then
// stops them, and returns how long that took.
func consumeAllOf(ctx context.Context, consumers []*consumer.Consumer, progress *progress) (time.Duration, error) {
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan error, len(consumers))
	for _, c := range consumers {
		go func() { stopped <- c.Run(runCtx) }()
	}
	select {
	case <-progress.done:
	case err := <-stopped:
		return 0, fmt.Errorf("a consumer stopped before the end of the stream: %v", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	elapsed := progress.last().Sub(start)
	stop()
	var errs []error
	for range consumers {
		errs = append(errs, <-stopped)
	}
	return elapsed, errors.Join(errs...)
}

// timedProvider is the sms mode's provider that also notes when each call arrived.
type timedProvider struct {
	*provider
	mu    sync.Mutex
	times []time.Time
}

func startTimedProvider(latency time.Duration) (*timedProvider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &timedProvider{provider: &provider{url: "http://" + ln.Addr().String(), latency: latency, calls: map[string]int{}}}
	p.server = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.times = append(p.times, time.Now())
		p.mu.Unlock()
		p.serve(w, r)
	})}
	go func() { _ = p.server.Serve(ln) }()
	return p, nil
}

// pace returns the time from the first call to the last, and the most calls that arrived within one
// second of each other.
func (p *timedProvider) pace() (took time.Duration, most int) {
	p.mu.Lock()
	times := slices.Clone(p.times)
	p.mu.Unlock()
	if len(times) < 2 {
		return 0, len(times)
	}
	slices.SortFunc(times, time.Time.Compare)
	return times[len(times)-1].Sub(times[0]), busiest.Within(times, time.Second)
}

func init() {
	modes["sms_rate"] = runSMSRate
	ownStream["sms_rate"] = true
}
