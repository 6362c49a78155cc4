package consumer

import (
	"time"
)

// SetBeforeOffsetCommit makes f run before each of c's offset commits, with the offset about to be
// committed. Set it before c runs: a crash test's child process uses it to die at that exact point.
func SetBeforeOffsetCommit(c *Consumer, f func(topic string, partition int, offset int64)) {
	c.beforeOffsetCommit = f
}

// SetBeforeAwait makes f run each time a partition of c is about to wait for news, with its id,
// whether it waits for a slot of its route, and a function that returns once its route has a free
// slot. Set it before c runs.
func SetBeforeAwait(c *Consumer, f func(partition int, wantsSlot bool, untilFree func())) {
	c.beforeAwait = func(p *partition) {
		f(p.id, p.wantsSlot, func() {
			for p.route.gate.Free() == 0 {
				time.Sleep(time.Millisecond)
			}
		})
	}
}
