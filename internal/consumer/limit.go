package consumer

import (
	"sync"
	"time"
)

// routeLimit bounds a route's handler runs across its partitions (Route.Concurrency), and pauses the
// route when a run is told to come back later (a retryable error's RetryAfter, a provider's 429):
// one throttled message means the provider is throttling the route, not that message.
//
// A partition takes a slot by sending on slots, which it can do in a select beside its other
// events, and gives it back by receiving.
type routeLimit struct {
	slots chan struct{}

	mu     sync.Mutex
	paused time.Time // no new start before then
}

func newRouteLimit(concurrency int) *routeLimit {
	return &routeLimit{slots: make(chan struct{}, concurrency)}
}

// tryAcquire takes a slot if one is free.
func (l *routeLimit) tryAcquire() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *routeLimit) release() { <-l.slots }

// pause holds the route's new starts for d from now, unless a longer pause is on.
func (l *routeLimit) pause(d time.Duration) {
	until := time.Now().Add(d)
	l.mu.Lock()
	defer l.mu.Unlock()
	if until.After(l.paused) {
		l.paused = until
	}
}

// pausedFor returns how long the route is still paused; 0 when it is not.
func (l *routeLimit) pausedFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(time.Until(l.paused), 0)
}
