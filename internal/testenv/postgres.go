package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// postgresStartTimeout bounds the wait for a new server to accept
// connections; it normally takes well under a second.
const postgresStartTimeout = 30 * time.Second

// PostgresOptions tunes StartPostgres.
type PostgresOptions struct {
	// Node makes the server reachable from the node's pods too: it also
	// listens on the node's HostIP and trusts the node's pod subnet (see
	// NodeURL).
	Node NodePods
}

// NodePods is where a node's pods are (a *nodeenv.Node is one): the
// address at which they reach this machine, and their subnet.
type NodePods interface {
	HostIP() net.IP
	PodCIDR() string
}

// Postgres is a private PostgreSQL server for one test or dev stack.
type Postgres struct {
	// URL connects to the server's default database "postgres", e.g.
	// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
	URL  string
	Port int
	// DataDir holds the cluster (pgdata/) and the server log; Stop removes it.
	DataDir string
	Process *Process

	binDir string
	cred   *syscall.Credential // nil unless we run as root
	node   NodePods

	mu      sync.Mutex
	stopped bool
}

// StartPostgres initialises a new cluster in a private directory and runs
// postgres on a free loopback port, trusting every local connection.
func StartPostgres(ctx context.Context, opts PostgresOptions) (*Postgres, error) {
	Sweep()
	binDir, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := newStackDir("postgres")
	if err != nil {
		return nil, err
	}
	p := &Postgres{DataDir: dir, binDir: binDir, node: opts.Node}
	if err := p.init(ctx); err != nil {
		p.Stop()
		return nil, err
	}
	// FreePort leaves a window in which another process can take the port;
	// on that (rare) race, try again with a new one.
	for attempt := 1; ; attempt++ {
		err = p.start(ctx)
		if err == nil {
			return p, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			p.Stop()
			return nil, err
		}
	}
}

// postgresBinDir finds the directory holding initdb, postgres and psql:
// Debian's /usr/lib/postgresql/<major>/bin (the newest major), else PATH.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if hasPostgresBinaries(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil && hasPostgresBinaries(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres, psql) not found in /usr/lib/postgresql/*/bin or PATH: install PostgreSQL (apt-get install postgresql)")
}

func hasPostgresBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres", "psql"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

func (p *Postgres) pgdata() string { return filepath.Join(p.DataDir, "pgdata") }

// init runs initdb. PostgreSQL refuses to run as root, so as root the
// cluster is created and served as the "postgres" OS user, which then has
// to own the directory.
func (p *Postgres) init(ctx context.Context) error {
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("postgres: running as root needs the \"postgres\" OS user: %w", err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(p.DataDir, int(uid), int(gid)); err != nil {
			return fmt.Errorf("postgres: chown data directory: %w", err)
		}
	}
	// -N skips fsync: a test cluster need not survive a power cut.
	cmd := p.command("initdb", "-D", p.pgdata(), "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--locale=C", "-N", "--no-instructions")
	if err := runToCompletion(ctx, "initdb", cmd, filepath.Join(p.DataDir, "initdb.log")); err != nil {
		return err
	}
	if p.node == nil {
		return nil
	}
	hba, err := os.OpenFile(filepath.Join(p.pgdata(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer hba.Close()
	if _, err := fmt.Fprintf(hba, "host all all %s trust\n", p.node.PodCIDR()); err != nil {
		return fmt.Errorf("postgres: pg_hba.conf: %w", err)
	}
	return nil
}

// start runs the server on a new free port and waits until it is the one
// answering there.
func (p *Postgres) start(ctx context.Context) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	p.Port = port
	p.URL = p.databaseURL("postgres")
	// Run postgres itself rather than `pg_ctl start`: pg_ctl daemonizes
	// the server, which would escape Pdeathsig and the process group Stop
	// signals. Durability settings are off because test data is disposable.
	listen := "127.0.0.1"
	if p.node != nil {
		listen += "," + p.node.HostIP().String()
	}
	cmd := p.command("postgres", "-D", p.pgdata(), "-p", strconv.Itoa(port),
		"-c", "listen_addresses="+listen,
		"-c", "unix_socket_directories="+p.pgdata(),
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200")
	proc, err := StartProcess("postgres", cmd, filepath.Join(p.DataDir, "postgres.log"))
	if err != nil {
		return err
	}
	p.Process = proc
	err = proc.WaitReady(ctx, postgresStartTimeout, func(ctx context.Context) error {
		// A cheap dial first, so psql is not spawned every poll while
		// the server is still starting.
		conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return err
		}
		conn.Close()
		// Something else could hold the port: ask for the data directory
		// to be sure the server answering is ours.
		out, err := p.psql(ctx, "postgres", "SHOW data_directory")
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(out); got != p.pgdata() {
			return fmt.Errorf("port %d is served by another PostgreSQL (data directory %s)", port, got)
		}
		return nil
	})
	if err != nil {
		proc.Stop(5 * time.Second)
		return fmt.Errorf("start postgres: %w", err)
	}
	return nil
}

func (p *Postgres) databaseURL(db string) string { return p.urlOn("127.0.0.1", db) }

// NodeURL is the URL of database db for the node's pods, when the server
// was started with PostgresOptions.Node.
func (p *Postgres) NodeURL(db string) string { return p.urlOn(p.node.HostIP().String(), db) }

func (p *Postgres) urlOn(host, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort(host, strconv.Itoa(p.Port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// command builds a command for one of the PostgreSQL binaries, run as the
// postgres OS user when we are root, with PG* variables of the caller's
// environment removed so they cannot redirect it.
func (p *Postgres) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(p.binDir, name), args...)
	cmd.Dir = p.DataDir // the postgres user cannot enter root's working directory
	cmd.Env = FilterEnv(os.Environ(), "PG")
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd
}

var databaseNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// CreateDatabase creates a database so that several coderds can share one
// server, and returns its URL.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) (string, error) {
	if !databaseNameRE.MatchString(name) {
		return "", fmt.Errorf("create database %q: name must match %s", name, databaseNameRE)
	}
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		return "", fmt.Errorf("create database %q: postgres on port %d is stopped", name, p.Port)
	}
	if _, err := p.psql(ctx, "postgres", "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("create database %q: %w", name, err)
	}
	return p.databaseURL(name), nil
}

// psql runs one SQL command over TCP and returns its unaligned output.
func (p *Postgres) psql(ctx context.Context, db, sql string) (string, error) {
	out, err := os.CreateTemp(p.DataDir, "psql-*.log")
	if err != nil {
		return "", fmt.Errorf("psql: %w", err)
	}
	out.Close()
	defer os.Remove(out.Name())
	cmd := exec.Command(filepath.Join(p.binDir, "psql"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres", "-d", db,
		"-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql)
	cmd.Env = FilterEnv(os.Environ(), "PG")
	if err := runToCompletion(ctx, "psql", cmd, out.Name()); err != nil {
		return "", err
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		return "", fmt.Errorf("psql: %w", err)
	}
	return string(b), nil
}

// Stop stops the server and removes its directory. It is safe to call more
// than once.
func (p *Postgres) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.stopped = true
	if p.Process != nil {
		// SIGTERM reaches the postmaster and its backends (one process
		// group), so the smart shutdown does not wait for clients.
		p.Process.Stop(10 * time.Second)
	}
	if p.DataDir != "" {
		removeStackDir(p.DataDir)
	}
}

// runToCompletion runs a short-lived tool through StartProcess and waits
// for it; a failure carries the tool's output.
func runToCompletion(ctx context.Context, name string, cmd *exec.Cmd, logPath string) error {
	proc, err := StartProcess(name, cmd, logPath)
	if err != nil {
		return err
	}
	select {
	case <-proc.done:
	case <-ctx.Done():
		proc.Stop(time.Second)
		return fmt.Errorf("%s: %w", name, ctx.Err())
	}
	if _, err := proc.Exited(); err != nil {
		return fmt.Errorf("%s failed (%v): %s", name, err, strings.TrimSpace(proc.LogTail(20)))
	}
	return nil
}
