package inbox_test

import (
	"slices"
	"testing"

	"github.com/inboxworker/inboxworker/internal/inbox"
)

// TestStarts checks the records of started ranges that the consumer's crash-loop guard keeps: a
// range started again in a row counts up, unless it is another range or another first message; a
// range that ended before the committed offset goes with the next record; a released range goes.
func TestStarts(t *testing.T) {
	t.Parallel()
	e := setup(t, inbox.Config{})
	ctx := t.Context()
	p := inbox.Partition{Group: "g", Topic: "t", Partition: 3}
	other := inbox.Partition{Group: "g", Topic: "t", Partition: 4}
	a, b := inbox.Fingerprint([]byte("a")), inbox.Fingerprint([]byte("b"))

	record := func(p inbox.Partition, first, last int64, fp [32]byte, finishedBefore int64) int {
		t.Helper()
		starts, err := e.store.StartLog().Record(ctx, p, inbox.StartedRange{First: first, Last: last, FirstFingerprint: fp}, finishedBefore)
		if err != nil {
			t.Fatal(err)
		}
		return starts
	}
	started := func(p inbox.Partition, from int64) []inbox.StartedRange {
		t.Helper()
		ranges, err := e.store.StartLog().Unfinished(ctx, p, from)
		if err != nil {
			t.Fatal(err)
		}
		return ranges
	}

	steps := []struct {
		name        string
		first, last int64
		fp          [32]byte
		want        int
	}{
		{"First", 0, 9, a, 1},
		{"Again", 0, 9, a, 2},
		{"AgainAgain", 0, 9, a, 3},
		{"OtherMessage", 0, 9, b, 1},
		{"OtherRange", 0, 4, b, 1},
		{"SameAgain", 0, 4, b, 2},
	}
	for _, s := range steps {
		if got := record(p, s.first, s.last, s.fp, 0); got != s.want {
			t.Errorf("%s: starts = %d, want %d", s.name, got, s.want)
		}
	}
	if got := record(other, 0, 4, b, 0); got != 1 {
		t.Errorf("another partition's range: starts = %d, want 1", got)
	}

	record(p, 5, 9, a, 0)
	if got := started(p, 0); len(got) != 2 || got[0].First != 0 || got[0].Starts != 2 || got[1].First != 5 || got[1].FirstFingerprint != a {
		t.Errorf("Started(from 0) = %+v, want [0,4] started twice and [5,9]", got)
	}
	if got := started(p, 5); len(got) != 1 || got[0].First != 5 {
		t.Errorf("Started(from 5) = %+v, want [5,9] only: [0,4] ended before", got)
	}

	// Committed up to 5: [0,4] finished, and goes with the next record.
	record(p, 10, 19, a, 5)
	var firsts []int64
	for _, r := range started(p, 0) {
		firsts = append(firsts, r.First)
	}
	if !slices.Equal(firsts, []int64{5, 10}) {
		t.Errorf("ranges after a commit at 5 = %v, want [5 10]", firsts)
	}

	if err := e.store.StartLog().Release(ctx, p, []int64{5, 10}); err != nil {
		t.Fatal(err)
	}
	if got := started(p, 0); len(got) != 0 {
		t.Errorf("ranges after release = %+v, want none", got)
	}
	if got := started(other, 0); len(got) != 1 {
		t.Errorf("the other partition's ranges = %+v, want its one", got)
	}
	if err := e.store.Ping(ctx); err != nil {
		t.Errorf("Ping() = %v", err)
	}
}
