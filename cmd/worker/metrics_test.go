package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/inboxworker/inboxworker/deploy"
)

// TestMetricsLive runs `worker run` and reads its /metrics: before any message, every series whose
// labels are known at start is there at 0; once it is ready, every metric that the alert rules and
// the dashboard in deploy/ name is there too, and the metrics of the worker's own are exactly those
// docs/operations.md describes.
func TestMetricsLive(t *testing.T) {
	t.Parallel()
	env := embeddedEnvironment(t)
	p := startWorker(t, []string{
		"KAFKA_BROKERS=" + env.brokers,
		"KAFKA_GROUP_ID=metrics-live",
		"KAFKA_SESSION_TIMEOUT=" + env.sessionTimeout,
		"DATABASE_URL=" + env.databaseURL,
		"HTTP_ADDR=127.0.0.1:0",
		"STARTUP_TIMEOUT=" + env.startupTimeout,
	}, "run")
	base := p.httpAddr()

	// No message was produced: the counters and the histogram exist, at 0.
	families := scrape(t, base)
	got := messagesTotal(families)
	for _, topic := range []string{topicPayments, topicSMS} {
		for _, outcome := range []string{"applied", "duplicate", "dead_lettered", "expired", "suppressed"} {
			if v, ok := got[topic][outcome]; !ok || v != 0 {
				t.Errorf("inboxworker_messages_total{topic=%q,outcome=%q} = %v (present %v), want 0 from the start",
					topic, outcome, v, ok)
			}
		}
		if n := len(families["inboxworker_retries_total"].GetMetric()); n != 2 {
			t.Errorf("inboxworker_retries_total has %d series, want one per topic from the start", n)
		}
		if n := handleCount(families, topic); n != 0 {
			t.Errorf("inboxworker_handle_seconds_count{topic=%q} = %v, want 0", topic, n)
		}
	}
	if n := len(families["inboxworker_handle_seconds"].GetMetric()); n != 2 {
		t.Errorf("inboxworker_handle_seconds has %d series, want one per topic from the start", n)
	}
	// The park's series, one per topic, and the routes' pause series, one per topic and reason
	// (outage, failing, retry_after, database), at 0.
	for name, want := range map[string]int{"inboxworker_parked_messages": 2, "inboxworker_parked_oldest_seconds": 2,
		"inboxworker_route_paused": 8, "inboxworker_route_pauses_total": 8} {
		series := families[name].GetMetric()
		if len(series) != want {
			t.Errorf("%s has %d series, want %d from the start", name, len(series), want)
		}
		for _, m := range series {
			if v := m.GetGauge().GetValue() + m.GetCounter().GetValue(); v != 0 {
				t.Errorf("%s%v = %v, want 0", name, m.GetLabel(), v)
			}
		}
	}

	// What this instance holds, one series per topic from the start (the group may have assigned
	// the partitions already).
	if n := len(families["inboxworker_assigned_partitions"].GetMetric()); n != 2 {
		t.Errorf("inboxworker_assigned_partitions has %d series, want one per topic from the start", n)
	}

	names := deployedMetricNames(t)
	t.Logf("metrics named by the alert rules and the dashboard: %v", names)
	eventually(t, func() string {
		code, body := get(t, base+"/metrics")
		if code != 200 {
			return fmt.Sprintf("/metrics: %d", code)
		}
		exposed := exposedNames(body)
		var missing []string
		for _, n := range names {
			if !exposed[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			return fmt.Sprintf("the worker's /metrics has no %v, named in deploy/", missing)
		}
		if !strings.Contains(body, "\ninboxworker_ready 1\n") {
			return "inboxworker_ready is not 1"
		}
		return ""
	})
	// The lag of every partition, none consumed yet.
	families = scrape(t, base)
	lag := gauges(families, "inboxworker_consumer_lag")
	if len(lag) != 2*partitions {
		t.Errorf("inboxworker_consumer_lag has %d series, want %d: %v", len(lag), 2*partitions, lag)
	}
	// The only member holds every partition, by its own count and by the group's description.
	eventually(t, func() string {
		families := scrape(t, base)
		for _, m := range families["inboxworker_assigned_partitions"].GetMetric() {
			if v := m.GetGauge().GetValue(); v != partitions {
				return fmt.Sprintf("inboxworker_assigned_partitions%v = %v, want %d", m.GetLabel(), v, partitions)
			}
		}
		owners := families["inboxworker_partition_owner"].GetMetric()
		if len(owners) != 2*partitions {
			return fmt.Sprintf("inboxworker_partition_owner has %d series, want %d", len(owners), 2*partitions)
		}
		for _, m := range owners {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == "client_id" && l.GetValue() == "inboxworker"
			}) {
				return fmt.Sprintf("inboxworker_partition_owner%v is not the worker's", m.GetLabel())
			}
		}
		return ""
	})

	families = scrape(t, base)
	// docs/operations.md describes every metric of the worker's own, and no other.
	documented := documentedMetrics(t)
	for name := range families {
		if strings.HasPrefix(name, "inboxworker_") && !documented[name] {
			t.Errorf("/metrics exposes %s, which docs/operations.md, Metrics, does not describe", name)
		}
	}
	for name := range documented {
		if families[name] == nil {
			t.Errorf("docs/operations.md, Metrics, describes %s, which /metrics does not expose", name)
		}
	}
}

// documentedMetric is a row of the metrics table of docs/operations.md: its first cell.
var documentedMetric = regexp.MustCompile("(?m)^\\| `([a-z_:][a-z0-9_:]*)` \\|")

// documentedMetrics returns the metrics the table of docs/operations.md, section Metrics, describes.
func documentedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Metrics\n")
	if !ok {
		t.Fatal("docs/operations.md has no section Metrics")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]bool{}
	for _, m := range documentedMetric.FindAllStringSubmatch(section, -1) {
		out[m[1]] = true
	}
	if len(out) == 0 {
		t.Fatal("docs/operations.md, Metrics, has no table of metrics")
	}
	return out
}

// metricName is a metric of the worker in a PromQL expression: its own, and the Go and process
// collectors'. Queries of other metrics would be caught by the check that each names one.
var metricName = regexp.MustCompile(`\b(?:inboxworker|go|process)_[a-zA-Z0-9_]+\b`)

// deployedMetricNames returns the metric names in the alert rules' expressions and the dashboard's
// queries. Each expression must name at least one.
func deployedMetricNames(t *testing.T) []string {
	t.Helper()
	var exprs []string
	rules := readDeploy(t, deploy.AlertRules)
	lines := strings.Split(rules, "\n")
	for i := 0; i < len(lines); i++ {
		indent, rest, ok := strings.Cut(lines[i], "expr:")
		if !ok || strings.TrimSpace(indent) != "" {
			continue
		}
		expr := strings.TrimSpace(rest)
		if expr == "|" { // a block: the lines indented deeper than expr:
			expr = ""
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" ||
				len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > len(indent)) {
				i++
				expr += lines[i] + "\n"
			}
		}
		exprs = append(exprs, expr)
	}
	if len(exprs) == 0 {
		t.Fatal("no expression found in the alert rules")
	}

	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(readDeploy(t, deploy.Dashboard)), &dashboard); err != nil {
		t.Fatalf("the dashboard: %v", err)
	}
	for _, p := range dashboard.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			exprs = append(exprs, target.Expr)
		}
	}
	for _, v := range dashboard.Templating.List {
		if v.Definition != "" {
			exprs = append(exprs, v.Definition)
		}
	}

	var names []string
	for _, e := range exprs {
		found := metricName.FindAllString(e, -1)
		if len(found) == 0 {
			t.Errorf("%q names none of the worker's metrics", e)
		}
		names = append(names, found...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// exposedNames returns the sample names of a text exposition, histograms' _bucket, _sum and
// _count included.
func exposedNames(body string) map[string]bool {
	out := map[string]bool{}
	for line := range strings.Lines(body) {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

func readDeploy(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
