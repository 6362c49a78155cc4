package consumer

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// pace holds a route's calls to its share of the group's rate (Route.RateLimit: calls per second
// for the whole consumer group). Each instance takes the share of the route's partitions it owns,
// set at every generation, so that N instances together never call faster than the rate, and no
// call asks anyone first. A throttled answer (a Retry-After) halves the instance's rate; it grows
// back by a tenth of its share each second without one (TCP's congestion control: a
// multiplicative decrease, an additive increase). The gate admits a message while a token is free
// (delay), and its call takes one right before it goes out, after its lease (gate.takeToken): what
// the provider sees keeps to the rate even when leases come back late and together. The time a
// message waits for a token is no fault of its own.
type pace struct {
	group float64 // the group's rate; 0: no limit

	mu      sync.Mutex
	share   float64 // this instance's fraction of group, by the partitions it owns
	factor  float64 // 1, halved at each throttling, recovering additively
	since   time.Time
	limiter *rate.Limiter
	onRate  func(perSecond float64)
}

// Of AIMD: the least factor of a throttled rate, and how much of it comes back per second.
const (
	minPaceFactor    = 1.0 / 64
	paceRecoveryRate = 0.1
)

func newPace(group float64, onRate func(float64)) *pace {
	p := &pace{group: group, share: 1, factor: 1, since: time.Now(), onRate: onRate}
	if group > 0 {
		p.limiter = rate.NewLimiter(rate.Limit(group), 1)
		p.apply(time.Now())
	}
	return p
}

// limited reports whether the route has a rate limit at all.
func (p *pace) limited() bool { return p.limiter != nil }

// delay says how long until a token is free, without taking one: 0 when at once, or without a
// limit.
func (p *pace) delay() time.Duration {
	if !p.limited() {
		return 0
	}
	now := time.Now()
	p.recover(now)
	tokens := p.limiter.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	perSecond := float64(p.limiter.Limit())
	if perSecond <= 0 {
		return time.Second
	}
	return time.Duration((1 - tokens) / perSecond * float64(time.Second))
}

// reserve takes a token, if the route has a limit, and says how long until it may be used: 0 when
// at once. A token not used is given back with cancel.
func (p *pace) reserve() (delay time.Duration, cancel func()) {
	if !p.limited() {
		return 0, func() {}
	}
	p.recover(time.Now())
	r := p.limiter.Reserve()
	if !r.OK() {
		return time.Second, func() {}
	}
	return r.Delay(), r.Cancel
}

// setShare sets the instance's share of the group's rate: owned of total partitions.
func (p *pace) setShare(owned, total int) {
	if !p.limited() || total <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.share = float64(owned) / float64(total)
	p.apply(time.Now())
}

// throttled halves the rate: the route's dependency asked to wait.
func (p *pace) throttled() {
	if !p.limited() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.recoverLocked(now)
	p.factor = max(p.factor/2, minPaceFactor)
	p.apply(now)
}

// recover lets a throttled rate grow back with the time since it was last set.
func (p *pace) recover(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.factor < 1 {
		p.recoverLocked(now)
		p.apply(now)
	}
}

func (p *pace) recoverLocked(now time.Time) {
	p.factor = min(p.factor+paceRecoveryRate*now.Sub(p.since).Seconds(), 1)
	p.since = now
}

// apply sets the limiter to the current rate, with a burst of 20ms of it; p.mu is held.
func (p *pace) apply(now time.Time) {
	perSecond := p.group * p.share * p.factor
	p.limiter.SetLimitAt(now, rate.Limit(perSecond))
	p.limiter.SetBurstAt(now, 1+int(perSecond/50))
	p.since = now
	if p.onRate != nil {
		p.onRate(perSecond)
	}
}
