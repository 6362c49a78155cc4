// Package deploy holds what operators deploy beside the worker: Prometheus alert rules with their
// promtool unit tests (prometheus/) and a Grafana dashboard (grafana/). It has no Go code of its own
// but the paths below; its tests run promtool, and cmd/worker's tests check every metric the rules
// and the dashboard name against a running worker's /metrics.
package deploy

// Paths of the files, relative to this directory.
const (
	AlertRules     = "prometheus/alerts.yml"
	AlertRuleTests = "prometheus/alerts_test.yml"
	Dashboard      = "grafana/inboxworker.json"
)
