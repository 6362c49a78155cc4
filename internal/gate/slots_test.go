package gate

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
)

// TestSlotsSlowStart: a call route's slots start at 4, grow with each answered run up to the
// route's concurrency, halve with each failure, and start slowly again after a pause; a database
// route's are all there from the start.
func TestSlotsSlowStart(t *testing.T) {
	t.Parallel()
	var limits []int
	s := newSlots(10, true, 3, func(limit int) { limits = append(limits, limit) })
	take := func() int {
		n := 0
		for s.tryAcquire() {
			n++
		}
		for range n {
			s.release()
		}
		return n
	}
	if n := take(); n != 4 {
		t.Fatalf("%d slots at start, want 4", n)
	}
	for range 20 {
		s.succeeded()
	}
	if n := take(); n != 10 {
		t.Errorf("%d slots after 20 answers, want the route's 10", n)
	}
	s.failed()
	if n := take(); n != 5 {
		t.Errorf("%d slots after a failure, want 10 halved, 5", n)
	}
	for range 5 {
		s.failed()
	}
	if n := take(); n != 3 {
		t.Errorf("%d slots after more failures, want the floor, 3: the keys the circuit needs to see failing", n)
	}
	s.restart()
	if n := take(); n != 4 {
		t.Errorf("%d slots after a restart, want 4", n)
	}
	if limits[0] != 4 || limits[len(limits)-1] != 4 {
		t.Errorf("limits reported %v, want from 4 to 4", limits)
	}

	db := newSlots(3, false, 3, nil)
	db.failed()
	if n := 0; true {
		for db.tryAcquire() {
			n++
		}
		if n != 3 {
			t.Errorf("a database route has %d slots, want all 3 whatever fails", n)
		}
	}
}

// TestSlotsAcquire: a run waiting for a slot gets the one freed, or the one a grown limit adds.
func TestSlotsAcquire(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newSlots(2, true, 3, nil)
		s.slowStart, s.limit = 1, 1
		if !s.tryAcquire() {
			t.Fatal("no first slot")
		}
		got := make(chan error, 2)
		go func() { got <- s.acquire(context.Background()) }()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("acquired a slot beyond the limit")
		default:
		}
		s.succeeded() // the limit grows to 2: the waiter gets it
		synctest.Wait()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() { got <- s.acquire(ctx) }()
		synctest.Wait()
		cancel()
		if err := <-got; err == nil {
			t.Fatal("acquire returned a slot after its context ended with none free")
		}
		s.release()
		go func() { got <- s.acquire(context.Background()) }()
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	})
}

// TestSlotsGrowth: at start the first round of answers opens a call route's whole window; once the
// provider has failed, or after a pause, the limit only quadruples per round of answers.
func TestSlotsGrowth(t *testing.T) {
	t.Parallel()
	round := func(s *slots) int {
		n := s.free()
		for range n {
			s.succeeded()
		}
		return s.free()
	}
	cases := []struct {
		name   string
		before func(*slots)
		want   []int // free slots before any answer, then after each round of answers
	}{
		{"at start", func(*slots) {}, []int{4, 128}},
		{"after a restart", (*slots).restart, []int{4, 16, 64, 128}},
		{"after a failure at start", (*slots).failed, []int{3, 12, 48, 128}},
	}
	for _, c := range cases {
		s := newSlots(128, true, 3, nil)
		c.before(s)
		got := []int{s.free()}
		for len(got) < len(c.want) {
			got = append(got, round(s))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: free slots after each round %v, want %v", c.name, got, c.want)
		}
	}
}
