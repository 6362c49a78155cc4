package consumer

// SetBeforeOffsetCommit makes f run after each finished batch, before its offset is committed. Set
// it before any consumer runs: a crash test's child process uses it to die at that exact point.
func SetBeforeOffsetCommit(f func(topic string, partition int, offset int64)) {
	beforeOffsetCommit = f
}
