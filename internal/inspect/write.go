package inspect

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/inboxworker/inboxworker/internal/notify"
	"github.com/inboxworker/inboxworker/internal/replay"
)

// A section writes one labelled part of a route's report: lines of text, the first after the
// label, the others under it.
type section struct {
	label string
	lines func(r RouteReport, now time.Time, dlqSuffix string) []string
}

// commonFirst and commonLast are every route's sections, before and after those of its kind.
var (
	commonFirst = []section{{"outcome", outcomeLines}, {"inbox", inboxLines}}
	commonLast  = []section{{"parked", parkedLines}, {"dead letter", deadLetterLines}}
)

// paymentSections are a payments route's own: what the callback recorded and the order it names.
// The outbox's order events (migration 00011) are one more section, after "order".
var paymentSections = []section{
	{"payment", paymentLines}, {"anomaly", anomalyLines}, {"order", orderLines}, {"transaction", transactionLines},
}

// smsSections are an SMS route's own: what was sent, and the call under way.
var smsSections = []section{{"sms", notificationLines}, {"lease", leaseLines}}

// write prints the report: a heading, then each route that knows the key.
func (rep Report) write(out io.Writer, dlqSuffix string) error {
	w := bufio.NewWriter(out)
	fmt.Fprintf(w, "idempotency key %s, as the database knows it at %s\n", replay.DisplayedKey([]byte(rep.Key)),
		rep.ReadAt.UTC().Format(time.DateTime+"Z"))
	for _, r := range rep.Routes {
		if !r.Known() {
			continue
		}
		fmt.Fprintf(w, "\nroute %s, topic %s\n", r.Route.Name, r.Route.Topic)
		sections := append([]section(nil), commonFirst...)
		switch r.Route.Kind {
		case Payments:
			sections = append(sections, paymentSections...)
		case SMS:
			sections = append(sections, smsSections...)
		}
		if r.Route.Kind != SMS && r.Lease != nil {
			sections = append(sections, section{"lease", leaseLines})
		}
		for _, s := range append(sections, commonLast...) {
			for i, line := range s.lines(r, rep.ReadAt, dlqSuffix) {
				label := s.label
				if i > 0 {
					label = ""
				}
				fmt.Fprintf(w, "  %-12s %s\n", label, line)
			}
		}
	}
	return w.Flush()
}

// outcomeLines says in one line what became of the key's message, from what the route holds.
func outcomeLines(r RouteReport, now time.Time, dlqSuffix string) []string {
	return []string{outcome(r, now, dlqSuffix)}
}

func outcome(r RouteReport, now time.Time, dlqSuffix string) string {
	if r.Inbox != nil || len(r.Payments) > 0 || len(r.Anomalies) > 0 || r.Notification != nil {
		return appliedOutcome(r)
	}
	switch {
	case len(r.Parked) > 0:
		return parkedOutcome(r.Parked[0], now)
	case r.Lease != nil && r.Lease.ExpiresAt.After(now):
		return "being sent: a call under the key is out, or was just made (its lease is live)"
	case r.Lease != nil:
		return fmt.Sprintf("not sent yet: %d call(s) made and none recorded; retried when its message comes again", r.Lease.Attempts)
	case len(r.DeadLetters) > 0:
		d := r.DeadLetters[len(r.DeadLetters)-1]
		if d.ReplayedAt != nil {
			return fmt.Sprintf("dead-lettered (%s), then replayed %s; not applied since", d.Letter.Reason, when(*d.ReplayedAt, now))
		}
		return fmt.Sprintf("dead-lettered (%s), kept in dead_letters: fix the cause, then worker replay %s",
			d.Letter.Reason, d.DLQTopic)
	}
	return "unknown"
}

// appliedOutcome is the outcome of a message whose effect committed: it has an inbox row, or left
// rows of its route's own.
func appliedOutcome(r RouteReport) string {
	var o string
	switch {
	case r.Route.Kind == Payments:
		o = paymentOutcome(r)
	case r.Route.Kind == SMS && r.Notification != nil && r.Notification.SentAt == nil:
		o = notSent[r.Notification.Status] + "; its notifications row committed with the inbox row"
	case r.Route.Kind == SMS && r.Notification != nil:
		o = "sent: the provider accepted it, and its notifications row committed with the inbox row"
	case r.Route.Kind == SMS:
		o = "handled, with no record of a send: its inbox row committed, and no notifications row says it was sent or not"
	default:
		o = "applied: its inbox row committed with its effect"
	}
	if r.Inbox == nil {
		o += "; its inbox row has expired and was purged, and the route's own rows keep it from being applied again"
	}
	return o
}

// paymentOutcome is the outcome of a payment callback that was applied or found a duplicate.
func paymentOutcome(r RouteReport) string {
	if len(r.Anomalies) > 0 {
		a := r.Anomalies[0]
		return fmt.Sprintf("applied: anomaly %s recorded on order %s, the order left as it was (a payment to refund or chase)",
			a.Kind, replay.Displayed(a.OrderNo))
	}
	if len(r.Payments) > 0 {
		p := r.Payments[0]
		if p.Result == "FAILED" {
			return fmt.Sprintf("applied: a failed payment recorded on order %s, which it leaves as it was", replay.Displayed(p.OrderNo))
		}
		return fmt.Sprintf("applied: order %s paid by %s %s", replay.Displayed(p.OrderNo), replay.Displayed(p.Provider), replay.Displayed(p.ProviderTxnID))
	}
	return "duplicate: recorded in the inbox, with no payment or anomaly under this key: its provider " +
		"transaction had been applied under another key (or its failed payment was later paid under another key)"
}

func parkedOutcome(p ParkedRow, now time.Time) string {
	if p.Ahead > 0 {
		return fmt.Sprintf("parked behind %d message(s) of its key, waiting for them", p.Ahead)
	}
	return fmt.Sprintf("parked, waiting for a retry: %d attempt(s) so far, the next %s", p.Attempts, when(p.NextAttemptAt, now))
}

func inboxLines(r RouteReport, now time.Time, _ string) []string {
	in := r.Inbox
	if in == nil {
		return []string{"no row: not applied (or applied, and purged once its retention ran out)"}
	}
	expiry := "remembered until " + when(in.ExpiresAt, now)
	if !in.ExpiresAt.After(now) {
		expiry = "expired " + when(in.ExpiresAt, now) + ", purged soon; it still counts as a duplicate until then"
	}
	return []string{fmt.Sprintf("recorded %s from %s/%d at offset %d; %s",
		when(in.ProcessedAt, now), in.Topic, in.Partition, in.Offset, expiry)}
}

func paymentLines(r RouteReport, now time.Time, _ string) []string {
	if len(r.Payments) == 0 {
		return []string{"none under this key"}
	}
	var lines []string
	for _, p := range r.Payments {
		line := fmt.Sprintf("%s %s %s, %s %s, order %s", p.Result, p.Amount, p.Currency,
			replay.Displayed(p.Provider), replay.Displayed(p.ProviderTxnID), replay.Displayed(p.OrderNo))
		if p.PaidAt != nil {
			line += ", paid at " + p.PaidAt.UTC().Format(time.RFC3339)
		}
		line += ", recorded " + when(p.ReceivedAt, now)
		switch {
		case p.Source != "callback":
			line += ", from " + p.Source
		case p.VerifiedBy != "":
			line += ", signature verified by key " + replay.Displayed(p.VerifiedBy)
		}
		lines = append(lines, line)
	}
	return lines
}

func anomalyLines(r RouteReport, now time.Time, _ string) []string {
	if len(r.Anomalies) == 0 {
		return []string{"none under this key"}
	}
	var lines []string
	for _, a := range r.Anomalies {
		lines = append(lines, fmt.Sprintf("%s on order %s: %s %s received for %s %s expected, %s %s, recorded %s",
			a.Kind, replay.Displayed(a.OrderNo), a.ReceivedAmount, a.ReceivedCurrency, a.ExpectedAmount, a.ExpectedCurrency,
			replay.Displayed(a.Provider), replay.Displayed(a.ProviderTxnID), when(a.CreatedAt, now)))
	}
	return lines
}

func orderLines(r RouteReport, now time.Time, _ string) []string {
	if len(r.Orders) == 0 {
		return []string{"none named, or not in orders"}
	}
	var lines []string
	for _, o := range r.Orders {
		line := fmt.Sprintf("%s %s, %s %s", replay.Displayed(o.OrderNo), o.Status, o.Amount, o.Currency)
		if o.ProviderTxnID != nil {
			line += ", paid by " + replay.Displayed(*o.ProviderTxnID)
		}
		if o.PaidAt != nil {
			line += " at " + o.PaidAt.UTC().Format(time.RFC3339)
		}
		lines = append(lines, line+", updated "+when(o.UpdatedAt, now))
	}
	return lines
}

func transactionLines(r RouteReport, now time.Time, _ string) []string {
	if len(r.Transactions) == 0 {
		return []string{"none recorded"}
	}
	var lines []string
	for _, t := range r.Transactions {
		lines = append(lines, fmt.Sprintf("%s %s belongs to order %s, %s %s (recorded %s)", replay.Displayed(t.Provider),
			replay.Displayed(t.ProviderTxnID), replay.Displayed(t.OrderNo), t.Amount, t.Currency, when(t.RecordedAt, now)))
	}
	return lines
}

// notSent says why an SMS of a notifications row without a send time was not sent, by its status.
var notSent = map[string]string{
	"EXPIRED":    "expired: not sent, too late to be of use",
	"SUPPRESSED": "suppressed: not sent, over its recipient's limit",
}

func notificationLines(r RouteReport, now time.Time, _ string) []string {
	n := r.Notification
	if n == nil {
		return []string{"no notifications row: not sent, or not recorded yet"}
	}
	if n.SentAt == nil {
		return []string{fmt.Sprintf("%s to %s, template %s, not sent, after %d attempt(s)",
			n.Status, n.Recipient, replay.Displayed(n.Template), n.Attempts)}
	}
	id := "none (accepted without one)"
	if n.ProviderMessageID != nil {
		id = replay.Displayed(*n.ProviderMessageID)
	}
	return []string{fmt.Sprintf("%s to %s, template %s, provider message id %s, after %d call(s), sent %s",
		n.Status, n.Recipient, replay.Displayed(n.Template), id, n.Attempts, when(*n.SentAt, now))}
}

func leaseLines(r RouteReport, now time.Time, _ string) []string {
	l := r.Lease
	if l == nil {
		return []string{"none: no call under the key is out"}
	}
	state := "live until " + when(l.ExpiresAt, now) + ": a call may be out; no other worker calls before"
	if !l.ExpiresAt.After(now) {
		state = "expired " + when(l.ExpiresAt, now) + ": the next call for the key takes it over"
	}
	return []string{fmt.Sprintf("held by %s, taken %s, %d call(s) so far; %s",
		replay.Displayed(l.Holder), when(l.TakenAt, now), l.Attempts, state)}
}

func parkedLines(r RouteReport, now time.Time, _ string) []string {
	if len(r.Parked) == 0 {
		return []string{"no"}
	}
	var lines []string
	for _, p := range r.Parked {
		place := "the head of its key"
		if p.Ahead > 0 {
			place = fmt.Sprintf("behind %d of its key", p.Ahead)
		}
		lines = append(lines,
			fmt.Sprintf("id %d from %s/%d at offset %d, key %s, %s, parked %s", p.ID, p.Topic, p.Partition, p.Offset,
				replay.DisplayedKey(p.MessageKey), place, when(p.ParkedAt, now)),
			parkedHistory(p, now),
			"message: "+message(r.Route.Kind, p.Value))
		if p.HeldUntil != nil && p.HeldUntil.After(now) {
			lines = append(lines, fmt.Sprintf("held by the retrier %s until %s", replay.Displayed(p.HeldBy), when(*p.HeldUntil, now)))
		}
	}
	return lines
}

// parkedHistory is a parked message's retries: attempts, budget, errors and the next attempt.
func parkedHistory(p ParkedRow, now time.Time) string {
	if p.FirstFailedAt == nil {
		return "not run yet; next attempt once those ahead of it have left"
	}
	h := fmt.Sprintf("%d attempt(s), %s of the retry budget spent; first failed %s: %s", p.Attempts,
		p.BudgetSpent.Round(time.Millisecond), when(*p.FirstFailedAt, now), strconv.Quote(p.FirstError))
	if p.LastError != p.FirstError {
		h += "; last error: " + strconv.Quote(p.LastError)
	}
	h += "; next attempt " + when(p.NextAttemptAt, now)
	if p.Reason != "" {
		h += "; dead-lettered " + p.Reason + " once its budget runs out"
	}
	return h
}

func deadLetterLines(r RouteReport, now time.Time, dlqSuffix string) []string {
	var lines []string
	for _, d := range r.DeadLetters {
		replayed := "not replayed: worker replay " + d.DLQTopic
		if d.ReplayedAt != nil {
			replayed = "replayed " + when(*d.ReplayedAt, now)
		}
		lines = append(lines,
			fmt.Sprintf("dead_letters id %d: %s after %d attempt(s), failed %s: %s", d.ID, d.Letter.Reason,
				d.Letter.Attempts, when(d.Letter.FailedAt, now), strconv.Quote(d.Letter.Error)),
			fmt.Sprintf("from %s/%d at offset %d, key %s; %s refused it: %s; %s", d.Letter.Topic, d.Letter.Partition,
				d.Letter.Offset, replay.DisplayedKey(d.Key), d.DLQTopic, strconv.Quote(d.WriteError), replayed),
			"message: "+message(r.Route.Kind, d.Value))
	}
	return append(lines, fmt.Sprintf("(%s in dead_letters; dead letters that %s took are in Kafka: worker replay %s --dry-run)",
		countOf(len(r.DeadLetters)), r.Route.Topic+dlqSuffix, r.Route.Topic+dlqSuffix))
}

func countOf(n int) string {
	if n == 0 {
		return "none"
	}
	return strconv.Itoa(n)
}

// message shows a message value by its fields, as the route reads it: never whole, a phone number
// masked and an SMS's params left out.
func message(kind Kind, value []byte) string {
	switch kind {
	case Payments:
		cb, err := callbackOf(value)
		if err != nil {
			return fmt.Sprintf("not a valid callback (%s) for order %s, %s %s", err, replay.Displayed(cb.OrderNo),
				replay.Displayed(cb.Provider), replay.Displayed(cb.ProviderTxnID))
		}
		return fmt.Sprintf("callback %s for order %s, %s %s, %s %s", cb.Result, replay.Displayed(cb.OrderNo),
			cb.Amount, cb.Currency, replay.Displayed(cb.Provider), replay.Displayed(cb.ProviderTxnID))
	case SMS:
		sms, err := notify.Decode(value)
		if err != nil {
			return "not a valid SMS event: " + err.Error()
		}
		return fmt.Sprintf("SMS to %s, template %s", notify.MaskPhone(sms.To), replay.Displayed(sms.Template))
	}
	return fmt.Sprintf("%d bytes", len(value))
}
