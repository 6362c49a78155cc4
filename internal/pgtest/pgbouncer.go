package pgtest

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bouncer is a PgBouncer in transaction mode in front of the test server, started for one test.
type Bouncer struct {
	// Addr is where it listens, host:port.
	Addr string
}

// PgBouncer starts PgBouncer (Debian's pgbouncer package) in front of the test server, on a port
// of its own, with pool_mode = transaction and trust authentication for users, and stops it when
// the test ends. settings are more lines of its [pgbouncer] section, such as
// "ignore_startup_parameters = search_path". It skips the test when pgbouncer is not installed.
func PgBouncer(tb testing.TB, users []string, settings ...string) *Bouncer {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil { // Debian puts it in /usr/sbin, which not every PATH has
		bin, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		tb.Skip("pgbouncer is not installed (Debian: apt-get install pgbouncer): no connection pooler to test through")
	}
	server, err := url.Parse(ServerURL())
	if err != nil {
		tb.Fatal(err)
	}
	// PgBouncer refuses to run as root: as root, it runs as postgres, which must read its files.
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	var auth strings.Builder
	for _, u := range users {
		fmt.Fprintf(&auth, "%q \"\"\n", u)
	}
	writeFile(tb, dir, "users.txt", auth.String())
	// The port is free when chosen, but another test may take it before PgBouncer listens on it.
	for try := 1; ; try++ {
		addr := freeAddr(tb)
		_, port, _ := net.SplitHostPort(addr)
		writeFile(tb, dir, "pgbouncer.ini", fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
%s
`, server.Hostname(), cmp.Or(server.Port(), "5432"), port, filepath.Join(dir, "users.txt"),
			strings.Join(settings, "\n")))
		output, ok := startBouncer(tb, bin, dir, addr)
		switch {
		case ok:
			return &Bouncer{Addr: addr}
		case try == 3:
			tb.Fatalf("pgbouncer did not start listening on a free port, three times:\n%s", output)
		}
	}
}

// startBouncer starts PgBouncer with the configuration in dir, and waits for it to listen on addr.
// It reports false, with its output, when it exits first.
func startBouncer(tb testing.TB, bin, dir, addr string) (string, bool) {
	out, err := os.Create(filepath.Join(dir, "pgbouncer.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close() // the process has its own copy
	output := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Stdout, cmd.Stderr = out, out
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: postgresUser(tb)}
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	deadline := time.After(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.Close()
			return "", true
		}
		select {
		case <-exited:
			return output(), false
		case <-deadline:
			tb.Fatalf("pgbouncer does not listen on %s: %v\n%s", addr, err, output())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func writeFile(tb testing.TB, dir, name, content string) {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// URL is the URL of database db through b, as user, with the query parameters params
// ("default_query_exec_mode=cache_describe", say).
func (b *Bouncer) URL(user, db string, params ...string) string {
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: b.Addr, Path: "/" + db,
		RawQuery: strings.Join(append([]string{"sslmode=disable"}, params...), "&")}
	return u.String()
}

// Role creates a role that logs in, whose search_path is db's schema and which may use everything
// in it, as a team behind a pooler sets it up, and drops it when the test ends. It returns its name.
func (db *DB) Role(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	role := randomName("role_")
	pool, err := admin.get()
	if err != nil {
		tb.Fatal(err)
	}
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN",
		"ALTER ROLE " + role + " SET search_path = " + db.Schema,
		"GRANT USAGE, CREATE ON SCHEMA " + db.Schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + db.Schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + db.Schema + " TO " + role,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			tb.Fatalf("%s: %v", stmt, err)
		}
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = pool.Exec(ctx, "DROP OWNED BY "+role)
		_, _ = pool.Exec(ctx, "DROP ROLE "+role)
	})
	return role
}

// postgresUser is the credential of the system user postgres, for what refuses to run as root.
func postgresUser(tb testing.TB) *syscall.Credential {
	u, err := user.Lookup("postgres")
	if err != nil {
		tb.Fatalf("pgbouncer refuses to run as root, and there is no user postgres to run it as: %v", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// freeAddr is a local address no one listens on, for now.
func freeAddr(tb testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
