package reconcile

import (
	"context"
	"sync"
	"time"
)

// The pause after a failed request: from minPause, doubling with each failure in a row, to maxPause.
const (
	minPause = time.Second
	maxPause = time.Minute
)

// pause keeps the workers from asking a status endpoint that fails: after a failure none asks until
// the pause is over, then one asks (the probe) while the others wait for its answer. An answer of
// any kind ends the pause.
type pause struct {
	mu      sync.Mutex
	delay   time.Duration // the current pause; 0 when not paused
	until   time.Time
	probing bool
}

// wait returns once the caller may ask: at once when not paused; else when the pause is over and
// no other probe is out, the caller's request being the probe (probe is true).
func (p *pause) wait(ctx context.Context) (probe bool, err error) {
	for {
		p.mu.Lock()
		now := time.Now()
		switch {
		case p.delay == 0:
			p.mu.Unlock()
			return false, ctx.Err()
		case !p.probing && !now.Before(p.until):
			p.probing = true
			p.mu.Unlock()
			return true, ctx.Err()
		}
		wait := p.until.Sub(now)
		if p.probing {
			wait = 100 * time.Millisecond
		}
		p.mu.Unlock()
		if err := sleep(ctx, wait); err != nil {
			return false, err
		}
	}
}

// paused reports whether a failure paused the asking and no answer has ended the pause yet.
func (p *pause) paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay > 0
}

// idle says the caller asked nothing after all (no order was due): its probe, if it was one, is
// another's to make.
func (p *pause) idle(probe bool) {
	if probe {
		p.mu.Lock()
		p.probing = false
		p.mu.Unlock()
	}
}

// answered ends the pause.
func (p *pause) answered() {
	p.mu.Lock()
	p.delay, p.probing = 0, false
	p.mu.Unlock()
}

// failed pauses the asking after a failed request, probe or not: for twice as long as the last
// pause, and says for how long, and whether this failure began the pause. A request that was out
// when the pause began changes nothing: it failed for the same reason.
func (p *pause) failed(probe bool) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.delay == 0
	if !first && !probe {
		return p.delay, false
	}
	p.delay = min(max(2*p.delay, minPause), maxPause)
	p.until, p.probing = time.Now().Add(p.delay), false
	return p.delay, first
}
