package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
)

// The broker runs in a child process, so that the memory measured is the consumer's alone and not
// the in-memory log of every message produced.
const brokerEnv = "INBOXWORKER_BENCH_BROKER"

// startBroker starts the embedded broker in a child process with topics created and returns its
// address and a function that stops it.
func startBroker(partitions int32, topics []string) (addr string, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), brokerEnv+"="+strconv.Itoa(int(partitions))+":"+strings.Join(topics, ","))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		stdin.Close() // the child exits when its stdin closes
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("broker did not start: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}

// runBroker is the child's main: it serves until its stdin closes.
func runBroker(spec string) error {
	partitions, topics, _ := strings.Cut(spec, ":")
	n, err := strconv.Atoi(partitions)
	if err != nil {
		return err
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(n), strings.Split(topics, ",")...))
	if err != nil {
		return err
	}
	defer cluster.Close()
	fmt.Println(cluster.ListenAddrs()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
