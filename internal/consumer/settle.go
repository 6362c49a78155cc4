package consumer

// settle marks the messages of a dispatch that finished and frees its ordering keys.
func (p *partition) settle(s settled) {
	p.running--
	for i, e := range s.d.entries {
		e.done = i < s.finished
		delete(p.busy, e.order)
	}
	for p.finished < len(p.window) && p.window[p.finished].done {
		p.finished++
	}
	if s.d.starts > 0 && s.finished > 0 {
		// A message of a range a run died in: its offset is committed before the next starts, so
		// that the next owner does not count this start against it.
		p.commit()
	}
}
