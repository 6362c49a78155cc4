package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/poll"

	"github.com/inboxworker/inboxworker/internal/pgtest"
	"github.com/inboxworker/inboxworker/internal/testlog"
)

// workerBin is the worker binary under test, built once by TestMain.
var workerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "inboxworker-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot create the binary's directory:", err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "worker")
	args := []string{"build", "-o", workerBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	pgtest.Main(m, func() { _ = os.RemoveAll(dir) })
}

// waitTimeout bounds every wait of these tests for the worker: a safety net against a hang, not an
// assertion on speed.
const waitTimeout = poll.Timeout

// process is a running worker binary. Its stderr (the logs) goes to t.Log and is kept for
// inspection; its stdout is kept.
type process struct {
	t   *testing.T
	cmd *exec.Cmd

	mu      sync.Mutex
	stdout  strings.Builder
	lines   []string         // every stderr line
	logs    []map[string]any // the stderr lines that are JSON logs
	changed chan struct{}    // closed and replaced whenever a line arrives
	exited  chan struct{}    // closed once the process has exited and its output is read
	state   *os.ProcessState
}

// startWorker starts the worker binary with args and exactly the environment env ("KEY=value").
func startWorker(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{t: t, changed: make(chan struct{}), exited: make(chan struct{})}
	p.cmd = exec.Command(workerBin, args...)
	// A race-built worker otherwise sleeps a second at exit, for reports that never come; a report
	// still fails the test, through the exit code and the logs.
	p.cmd.Env = append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.cmd.Stdout = writerFunc(func(b []byte) (int, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.stdout.Write(b)
	})
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stderr)
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *process) read(stderr io.Reader) {
	defer close(p.exited)
	scanner := bufio.NewScanner(stderr)
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		p.t.Log("worker:", line)
		var entry map[string]any
		isLog := json.Unmarshal([]byte(line), &entry) == nil
		if isLog {
			// What a strict log ingester reads: no key twice in one object.
			if err := testlog.Strict([]byte(line)); err != nil {
				p.t.Errorf("the worker wrote a log line that strict log ingesters refuse: %v\n%s", err, line)
			}
		}
		p.mu.Lock()
		p.lines = append(p.lines, line)
		if isLog {
			p.logs = append(p.logs, entry)
		}
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}
	_ = p.cmd.Wait()
	p.mu.Lock()
	p.state = p.cmd.ProcessState
	p.mu.Unlock()
}

// waitLog waits for a log entry whose msg is msg and returns it. It fails the test if the process
// exits first.
func (p *process) waitLog(msg string) map[string]any {
	p.t.Helper()
	return awaitEntry(p, fmt.Sprintf("log %q", msg), func() []map[string]any { return p.logs },
		func(l map[string]any) bool { return l["msg"] == msg })
}

// waitLine waits for a stderr line that contains s. It fails the test if the process exits first.
func (p *process) waitLine(s string) {
	p.t.Helper()
	awaitEntry(p, fmt.Sprintf("log a line with %q", s), func() []string { return p.lines },
		func(line string) bool { return strings.Contains(line, s) })
}

// awaitEntry waits until one of the entries (read under p.mu; they only grow) matches and returns
// it. It fails the test, saying that the worker did not do what, if the process exits first or
// waitTimeout runs out.
func awaitEntry[T any](p *process, what string, entries func() []T, matches func(T) bool) T {
	p.t.Helper()
	deadline := time.After(waitTimeout)
	for seen := 0; ; {
		p.mu.Lock()
		list, changed := entries(), p.changed
		p.mu.Unlock()
		for ; seen < len(list); seen++ {
			if matches(list[seen]) {
				return list[seen]
			}
		}
		select {
		case <-changed:
		case <-p.exited:
			p.mu.Lock()
			n := len(entries())
			p.mu.Unlock()
			if n == seen {
				p.t.Fatalf("the worker exited and did not %s", what)
			}
		case <-deadline:
			p.t.Fatalf("the worker did not %s", what)
		}
	}
}

// findLog returns the first log entry logged so far whose msg is msg and whose attribute key is
// value, or nil.
func (p *process) findLog(msg, key, value string) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.logs {
		if l["msg"] == msg && l[key] == value {
			return l
		}
	}
	return nil
}

// allLogs returns the log entries logged so far.
func (p *process) allLogs() []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]map[string]any(nil), p.logs...)
}

// httpAddr waits until the worker serves HTTP and returns its base URL.
func (p *process) httpAddr() string {
	p.t.Helper()
	addr, _ := p.waitLog("http listening")["addr"].(string)
	return "http://" + addr
}

// wait waits for the process to exit and returns its exit code.
func (p *process) wait() int {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(waitTimeout):
		p.t.Fatal("the worker did not exit")
	}
	return p.state.ExitCode()
}

func (p *process) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

func (p *process) output() (stdout string, stderrLines []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String(), append([]string(nil), p.lines...)
}

// get fetches url and returns the status code and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// eventually calls check every 50ms until it returns "" and fails the test with its last answer if
// that does not happen within waitTimeout.
func eventually(t *testing.T, check func() string) {
	t.Helper()
	poll.Until(t, check)
}
