package gate

import (
	"context"
	"sync"
)

// slots bound how many of a route's handler runs go at once, across its partitions: at most max
// (Config.Concurrency), a batch counting once. A call route's slots start slowly: after start, after
// a pause of the route ends and after a probe is answered, its limit is slowStart, and it grows with
// each answered call up to max, and halves with each retryable failure, so that a provider that is
// down at start, has just come back, or is failing, is not met with a whole window of calls at once.
// How fast it grows depends on what is known: at start nothing speaks against the provider, and the
// first round of answers opens the whole window (coldGrowth); after a failure, a pause or a probe the
// provider has just been failing, and the limit only quadruples per round (slowStartGrowth). It
// never halves below floor: as many keys as the route's circuit needs failing to tell an outage from
// a few bad keys (a message retried in place keeps its slot through its backoff, so a limit of one
// would show the circuit one key, and its retry budget would run out before the route pauses).
type slots struct {
	max        int
	slowStart  int // 0: no slow start, the limit is max
	floor      int
	growth     int // how much an answered call adds to the limit
	mu         sync.Mutex
	limit      int
	inUse      int
	freed      chan struct{} // closed and replaced when a slot is freed or the limit grows
	onLimitSet func(limit int)
}

// slowStartLimit is where a call route's concurrency starts, unless its maximum is lower.
const slowStartLimit = 4

// slowStartGrowth is how much each answered call grows the limit once the provider has been failing:
// the limit quadruples per round of calls, 4, 16, 64, 128 in three rounds (TCP's +1 per answer, a
// doubling per round, took five rounds to 128: half a second at 100 ms a call).
const slowStartGrowth = 3

// coldGrowth is how much each answered call grows the limit at start, before anything failed: the
// first slowStart answers open the whole window, max in one round of calls. Three rounds at start
// cost a tenth of a 2,000-message burst at 100 ms a call; a provider down at start still sees only
// the first slowStart calls.
func coldGrowth(slowStart, most int) int {
	return max((most+slowStart-1)/slowStart, slowStartGrowth)
}

func newSlots(most int, slowStart bool, floor int, onLimitSet func(int)) *slots {
	s := &slots{max: most, limit: most, floor: max(min(floor, most), 1), freed: make(chan struct{}),
		onLimitSet: onLimitSet}
	if slowStart {
		s.slowStart = min(max(slowStartLimit, s.floor), most)
		s.limit = s.slowStart
		s.growth = coldGrowth(s.slowStart, most)
	}
	s.report()
	return s
}

// tryAcquire takes a slot if one is free under the limit.
func (s *slots) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inUse >= s.limit {
		return false
	}
	s.inUse++
	return true
}

// acquire waits for a free slot, or for ctx to be done.
func (s *slots) acquire(ctx context.Context) error {
	for {
		freed := s.changed() // before the try: a slot freed after it closes this
		if s.tryAcquire() {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inUse--
	s.signal()
}

// changed is closed when a slot is freed or the limit grows: whoever waits for a slot tries again.
func (s *slots) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freed
}

// free returns how many slots are free now.
func (s *slots) free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.limit-s.inUse, 0)
}

// succeeded grows a slow-starting limit by its growth, up to max.
func (s *slots) succeeded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slowStart == 0 || s.limit >= s.max {
		return
	}
	s.limit = min(s.limit+s.growth, s.max)
	s.signal()
	s.report()
}

// failed halves a slow-starting limit, down to the floor; from now on it grows only by
// slowStartGrowth.
func (s *slots) failed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slowStart == 0 {
		return
	}
	s.growth = slowStartGrowth
	if s.limit <= s.floor {
		return
	}
	s.limit = max(s.limit/2, s.floor)
	s.report()
}

// restart starts the limit slowly again: the route's dependency has just come back.
func (s *slots) restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slowStart == 0 {
		return
	}
	s.limit = s.slowStart
	s.growth = slowStartGrowth
	s.report()
}

// signal wakes whoever waits for a slot; s.mu is held.
func (s *slots) signal() {
	close(s.freed)
	s.freed = make(chan struct{})
}

// report tells onLimitSet the limit; s.mu is held.
func (s *slots) report() {
	if s.onLimitSet != nil {
		s.onLimitSet(s.limit)
	}
}
