package consumer

// SetBeforeOffsetCommit makes f run before each of c's offset commits, with the offset about to be
// committed. Set it before c runs: a crash test's child process uses it to die at that exact point.
func SetBeforeOffsetCommit(c *Consumer, f func(topic string, partition int, offset int64)) {
	c.beforeOffsetCommit = f
}
