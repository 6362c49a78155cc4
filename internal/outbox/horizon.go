package outbox

import (
	"slices"
)

// The horizon is the position up to which the relay may publish: every transaction that drew a
// position at or below it has ended (committed, and is visible to the relay's next statements, or
// rolled back). Positions are drawn in order (the sequence has no cache) and only under the
// outbox's emitter lock, which a transaction holds until it ends, so:
//
//  1. the relay reads the last position drawn, L;
//  2. then the transactions holding the emitter lock, V: every transaction that drew a position at
//     or below L and has not ended is among them;
//  3. once none of V holds the lock any more (read in a later round), every position at or below L
//     is final, and the horizon moves to L. When V is empty, at once.
//
// A transaction that ended before step 3 read the lock table had left the list of running
// transactions before it released its locks, so the relay's statements after step 3 see its commit.
// A transaction still running that emitted holds the horizon back — and with it every event drawn
// after its own — until it ends: emitting transactions must stay short, as the inbox's are. The
// same holds for a prepared transaction (PREPARE TRANSACTION keeps its locks) until it is committed
// or rolled back.
//
// This is the outbox polling of the literature (a transaction id on every row, and a reader that
// stays below pg_snapshot_xmin(pg_current_snapshot())) with two differences: transaction ids are not
// commit order — of two emitters of one aggregate, the one that drew its id first may be the one
// that waited for the other's lock, so ordering by them would publish its event first —, so the
// order stays the position's; and only the transactions that emitted into this outbox hold the
// horizon back, not every transaction of the server.

// lastPositionSQL reads the last position drawn: step 1.
const lastPositionSQL = `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_position_seq`

// emittersSQL lists the transactions holding the emitter lock of this schema's outbox, in either
// mode: step 2. An advisory lock on a bigint key is shown in pg_locks with the key's high half as
// classid and its low half as objid.
const emittersSQL = `
SELECT coalesce(array_agg(l.virtualtransaction), '{}')
FROM pg_locks l, (SELECT ` + emitterLockKey + ` AS k) AS key
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((key.k >> 32) & 4294967295)::oid AND l.objid = (key.k & 4294967295)::oid`

// horizon is the relay's horizon and the candidate that may move it next.
type horizon struct {
	at int64 // every position at or below it is final
	// candidate, when pending, is a last position read with the emitters read after it: the
	// horizon moves to candidate once none of them holds the emitter lock.
	candidate int64
	emitters  []string
	pending   bool
}

// observe takes a reading of steps 1 and 2 — last, then emitters — and moves the horizon as far as
// the readings allow.
func (h *horizon) observe(last int64, emitters []string) {
	if h.pending && !slices.ContainsFunc(h.emitters, func(e string) bool { return slices.Contains(emitters, e) }) {
		h.at = max(h.at, h.candidate)
		h.pending = false
	}
	switch {
	case len(emitters) == 0:
		h.at = max(h.at, last)
		h.pending = false
	case !h.pending && last > h.at:
		h.candidate, h.emitters, h.pending = last, emitters, true
	}
}

// reset starts the horizon at the cursor of a lease just taken.
func (h *horizon) reset(cursor int64) { *h = horizon{at: cursor} }
