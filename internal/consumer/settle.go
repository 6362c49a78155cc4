package consumer

// settle marks the messages of a dispatch that finished, and the others abandoned, in the window:
// the finished messages' ordering keys are free, an abandoned message's stays in flight.
func (p *partition) settle(s settled) {
	p.running--
	p.window.settle(s.d.entries, s.finished)
	if s.d.starts > 0 && s.finished > 0 {
		// A message of a range a run died in: its offset is committed before the next starts, so
		// that the next owner does not count this start against it.
		p.commit()
	}
}
