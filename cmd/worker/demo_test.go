package main_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

// TestDemo runs `worker demo` twice, as a newcomer would: each run finishes by itself with exit code
// 0, and its summary matches the demo schema it leaves behind and the stream it generated.
func TestDemo(t *testing.T) {
	t.Parallel()
	var summaries []string
	var anomalyLines []int // per run: log lines of an anomaly recorded
	for run := 1; run <= 2; run++ {
		p := startWorker(t, []string{"DATABASE_URL=" + pgtest.ServerURL()}, "demo")
		if code := p.wait(); code != 0 {
			t.Fatalf("run %d: exit code %d, want 0", run, code)
		}
		stdout, stderr := p.output()
		t.Logf("run %d:\n%s", run, stdout)
		anomalyLines = append(anomalyLines, 0)
		for _, line := range stderr {
			if strings.Contains(line, "payment anomaly recorded") {
				anomalyLines[run-1]++
			}
		}
		_, summary, ok := strings.Cut(stdout, "\nSummary")
		if !ok {
			t.Fatalf("run %d printed no summary", run)
		}
		summaries = append(summaries, summary)
	}
	if summaries[0] != summaries[1] {
		t.Errorf("the second run's summary differs from the first:\n%s\n%s", summaries[0], summaries[1])
	}

	summary := summaries[1]
	table := map[string][]string{}
	for line := range strings.Lines(summary) {
		if f := strings.Fields(line); len(f) == 7 {
			table[f[0]] = f[1:]
		}
	}
	// received, applied, duplicates skipped, anomalies, dead-lettered, SMS sent: what the generated
	// stream must come to.
	// The order events: one per callback applied; the SMS topic: the generated events and the one
	// payment-received SMS of DEMO-1001, whose customer has a phone.
	want := map[string][]string{
		"payments.callbacks": {"14", "7", "4", "3", "3", "-"},
		"payments.events":    {"8", "8", "0", "-", "0", "-"}, // the lost order's, paid by reconciliation, too
		"notifications.sms":  {"8", "4", "3", "-", "1", "4"},
	}
	for topic, w := range want {
		if got := strings.Join(table[topic], " "); got != strings.Join(w, " ") {
			t.Errorf("%s: summary row %q, want %q", topic, got, strings.Join(w, " "))
		}
	}
	// A newcomer reads that applied counts the anomalies, and a psql line that runs as printed.
	if !strings.Contains(summary, "Applied counts the anomalies") {
		t.Errorf("the summary does not say that applied counts the anomalies:\n%s", summary)
	}
	if !strings.Contains(summary, "psql '"+pgtest.ServerURL()+"'") {
		t.Errorf("the summary's psql line does not name the database it used:\n%s", summary)
	}
	// Each anomaly is logged once, when it commits, however often its batch ran.
	for run, n := range anomalyLines {
		if row := table["payments.callbacks"]; len(row) > 3 && fmt.Sprint(n) != row[3] {
			t.Errorf("run %d: %d log lines of an anomaly recorded, for %s anomalies", run+1, n, row[3])
		}
	}

	// The same numbers, read from the schema the demo left behind.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var payments, anomalies, sent, paymentKeys, smsKeys int
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inboxworker_demo.payments WHERE source = 'callback'),
		(SELECT count(*) FROM inboxworker_demo.payment_anomalies),
		(SELECT count(*) FROM inboxworker_demo.notifications WHERE status = 'SENT'),
		(SELECT count(*) FROM inboxworker_demo.inbox WHERE handler = 'payments'),
		(SELECT count(*) FROM inboxworker_demo.inbox WHERE handler = 'sms')`).
		Scan(&payments, &anomalies, &sent, &paymentKeys, &smsKeys)
	if err != nil {
		t.Fatal(err)
	}
	// Each applied callback left one payments row or one anomaly; the provider's resend of a paid
	// transaction left an inbox row and nothing else.
	db := map[string][]string{
		"payments.callbacks": {fmt.Sprint(payments + anomalies), fmt.Sprint(anomalies), fmt.Sprint(paymentKeys - 1)},
		"notifications.sms":  {fmt.Sprint(sent), "-", fmt.Sprint(smsKeys)},
	}
	for topic, d := range db {
		row := table[topic]
		if len(row) != 6 || row[1] != d[0] || row[3] != d[1] || row[1] != d[2] {
			t.Errorf("%s: summary row %v does not match the database (applied %s, anomalies %s, inbox keys applied %s)",
				topic, row, d[0], d[1], d[2])
		}
	}
	if table["notifications.sms"][5] != fmt.Sprint(sent) {
		t.Errorf("SMS sent %s, the database has %d", table["notifications.sms"][5], sent)
	}
	// One callback, redelivered three times: one PAID, one event, one SMS.
	const chain = "End to end: DEMO-1001's callback delivered 4 times -> order PAID, 1 order.paid event on payments.events, 1 payment_received SMS sent"
	if !strings.Contains(summary, chain) {
		t.Errorf("the summary does not say %q", chain)
	}
	var events, receipts int
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM inboxworker_demo.outbox_events o WHERE aggregateid = 'DEMO-1001' AND type = 'order.paid'
			AND NOT EXISTS (SELECT FROM inboxworker_demo.outbox_waiting w WHERE w.position = o.position AND w.ordinal = o.ordinal)),
		(SELECT count(*) FROM inboxworker_demo.notifications WHERE template = 'payment_received')`).Scan(&events, &receipts)
	if err != nil || events != 1 || receipts != 1 {
		t.Errorf("the database has %d order.paid events of DEMO-1001 published and %d payment_received SMS (%v), want 1 and 1",
			events, receipts, err)
	}

	rows, err := conn.Query(ctx, `SELECT order_no || ' ' || status FROM inboxworker_demo.orders ORDER BY order_no`)
	if err != nil {
		t.Fatal(err)
	}
	orders, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := "Orders: " + strings.Join(orders, ", ") + "\n"; !strings.Contains(summary, want) {
		t.Errorf("the summary does not list the orders as the database has them: %q", want)
	}
	// The lost callback, found by asking the provider.
	if !strings.Contains(summary, "Found by reconciliation, their callbacks lost: DEMO-1007\n") ||
		!slices.Contains(orders, "DEMO-1007 PAID") {
		t.Errorf("the summary does not say that reconciliation paid DEMO-1007, or the database does not have it paid")
	}
	if !strings.Contains(summary, "agree with these counts") {
		t.Error("the consumer's metrics do not agree with the summary")
	}
}
