package consumer

import (
	"sync"
	"time"
)

// repeats keeps a log from saying one thing over and over: the first time a thing happens it is
// said; after that, at most once per interval, with how many times it happened since it was last
// said. A broker refusing commits, or a reader failing its fetches, fails every second: an
// operator needs to know that, and how often, not 3,600 lines an hour.
//
// A repeats is safe for concurrent use. Its zero value says everything (no interval).
type repeats struct {
	interval time.Duration

	mu   sync.Mutex
	seen map[string]*repeat
}

type repeat struct {
	said   time.Time // when it was last said
	silent int       // how many times it happened since, unsaid
}

// say reports whether what happened at now is to be said, and if so how many times it happened
// unsaid since it was last said.
func (r *repeats) say(what string, now time.Time) (ok bool, since int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = make(map[string]*repeat)
	}
	s := r.seen[what]
	switch {
	case s == nil:
		r.seen[what] = &repeat{said: now}
		return true, 0
	case now.Sub(s.said) >= r.interval:
		since = s.silent
		s.said, s.silent = now, 0
		return true, since
	}
	s.silent++
	return false, 0
}

// forget makes what new again: said at once the next time it happens (the commits go through
// again, say).
func (r *repeats) forget(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.seen, what)
}

// repeatInterval is how often a repeating warning is said again.
const repeatInterval = time.Minute
