//go:build race

package main_test

// raceEnabled builds the worker under test with the race detector when the tests run with it.
const raceEnabled = true
