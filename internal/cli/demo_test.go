package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	neturl "net/url"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/inboxworker/inboxworker/internal/deadletter"
	"github.com/inboxworker/inboxworker/internal/devbroker"
	"github.com/inboxworker/inboxworker/internal/kafkatest"
	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// TestDemoAgainstTheTopics plays the demo against a broker the test owns, so that the topics outlive
// it, then reads them itself: the summary's received column is what each source topic holds, its
// dead-lettered column what each dead-letter topic holds, and its "Dead letters in" lines the
// reasons those dead letters carry. (The demo's own check only compares its reading with the
// consumer's counters.) It runs in a database of its own: the demo's schema has a fixed name.
func TestDemoAgainstTheTopics(t *testing.T) {
	t.Parallel()
	dbURL := freshDatabase(t)
	cfg := parseConfig(t, map[string]string{"DATABASE_URL": dbURL, "HTTP_ADDR": "127.0.0.1:0"}, "demo")
	log := testlog.New(t)
	cfg.Receipts = true // as runDemo: the order events' topic is one of the broker's
	broker, err := devbroker.Start(t.Context(), "127.0.0.1:0", cfg.devTopics(), cfg.DLQSuffix, log)
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	var out bytes.Buffer
	a := &app{getenv: func(string) string { return "" }, stdout: &out, stderr: io.Discard}
	if err := playDemo(t.Context(), a, cfg, log, broker.Addr); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	cluster := &kafkatest.Cluster{Cluster: broker.Cluster, Addr: broker.Addr}
	for _, topic := range []string{cfg.Topic(paymentsInbox), cfg.Topic(smsInbox)} { // the order events' have no dead letter
		received, dead := 0, 0
		reasons := map[string]int{}
		for p := range devbroker.Partitions {
			received += len(cluster.ReadAll(t, topic, p))
			for _, m := range cluster.ReadAll(t, topic+cfg.DLQSuffix, p) {
				dead++
				for _, h := range m.Headers {
					if h.Key == deadletter.HeaderReason {
						reasons[string(h.Value)]++
					}
				}
			}
		}
		row := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(topic) + `\s+(\d+)\s+\d+\s+\d+\s+\S+\s+(\d+)\s`).
			FindStringSubmatch(out.String())
		if row == nil {
			t.Fatalf("no summary row for %s in:\n%s", topic, out.String())
		}
		if got, _ := strconv.Atoi(row[1]); got != received || received == 0 {
			t.Errorf("%s: the summary says %d received, the topic holds %d", topic, got, received)
		}
		if got, _ := strconv.Atoi(row[2]); got != dead || dead == 0 {
			t.Errorf("%s: the summary says %d dead-lettered, %s holds %d", topic, got, topic+cfg.DLQSuffix, dead)
		}
		for reason, n := range reasons {
			line := regexp.MustCompile(`Dead letters in ` + regexp.QuoteMeta(topic+cfg.DLQSuffix) + `:.*\b` +
				regexp.QuoteMeta(reason) + ` ` + strconv.Itoa(n) + `\b`)
			if !line.MatchString(out.String()) {
				t.Errorf("%s: the topic holds %d dead letters of reason %s; the summary says otherwise:\n%s",
					topic, n, reason, out.String())
			}
		}
	}
}

// freshDatabase creates a database for the test alone, dropped when it ends, and returns its URL.
func freshDatabase(t *testing.T) string {
	t.Helper()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "demo_test_" + hex.EncodeToString(suffix)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, pgtest.ServerURL())
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u, err := neturl.Parse(pgtest.ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return fmt.Sprint(u)
}
