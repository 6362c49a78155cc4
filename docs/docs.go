// Package docs holds the project's documentation (the Markdown pages of this directory) and the
// tests that keep it true: the Go names, settings, metrics, alerts, log lines, links and file map the
// pages cite are checked against the code (docs_test.go). It has no code of its own.
package docs
