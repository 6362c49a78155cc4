package consumer

// SetBeforeOffsetCommit makes f run before each offset commit, with the offset about to be committed. Set
// it before any consumer runs: a crash test's child process uses it to die at that exact point.
func SetBeforeOffsetCommit(f func(topic string, partition int, offset int64)) {
	beforeOffsetCommit = f
}
