package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// defaultCoderStartTimeout bounds the wait for coderd to answer. It
// normally answers within a few seconds (database migrations included).
const defaultCoderStartTimeout = 60 * time.Second

// CoderOptions configures StartCoder.
type CoderOptions struct {
	// SkipFirstUser leaves coderd without its first user, for tests of
	// first-user setup done by the operator.
	SkipFirstUser bool
	// Postgres, when set, is used instead of starting a private one (a new
	// database is created in it). Stop leaves it running.
	Postgres *Postgres
	// PostgresURL, when set, is the database coderd uses as it is: no
	// server is started and no database created (for a database managed
	// elsewhere). It takes precedence over Postgres.
	PostgresURL string
	// HTTPPort is the port coderd listens on; 0 picks a free one.
	HTTPPort int
	// Host is the address coderd listens on, which its URL and access
	// URL name; empty means 127.0.0.1. `make dev` gives the host's end of
	// its node's network (nodeenv.Node.HostIP), which pods reach too.
	Host string
	// StartTimeout bounds the wait for coderd to become ready; 0 means one
	// minute. coderd itself retries an unreachable database for 30s.
	StartTimeout time.Duration
	// ProvisionerTypes are the job types coderd's built-in provisioner
	// daemons run (--provisioner-types); empty is coderd's default,
	// terraform only. codersdk.ProvisionerTypeEcho builds a template
	// version pushed with PushEchoTemplate instantly.
	ProvisionerTypes []codersdk.ProvisionerType
	// ProvisionerDaemons is the number of built-in provisioner daemons
	// (--provisioner-daemons); 0 is coderd's default, 3.
	ProvisionerDaemons int
	// DisableRateLimits turns off coderd's API rate limits
	// (--dangerous-disable-rate-limits; by default 512 requests a minute
	// per user and endpoint), for seeding many objects quickly.
	DisableRateLimits bool
	// Env is added to coderd's environment, which its provisioner passes
	// on to OpenTofu and the commands templates run (less CODER_*), for
	// example KUBECONFIG for the kubectl of KubernetesTemplate.
	Env []string
}

// serverArgs are the `coder server` flags opts asks for beyond the ones
// every testenv coderd runs with.
func (opts CoderOptions) serverArgs() []string {
	var args []string
	if len(opts.ProvisionerTypes) > 0 {
		types := make([]string, len(opts.ProvisionerTypes))
		for i, t := range opts.ProvisionerTypes {
			types[i] = string(t)
		}
		args = append(args, "--provisioner-types", strings.Join(types, ","))
	}
	if opts.ProvisionerDaemons > 0 {
		args = append(args, "--provisioner-daemons", strconv.Itoa(opts.ProvisionerDaemons))
	}
	if opts.DisableRateLimits {
		args = append(args, "--dangerous-disable-rate-limits")
	}
	return args
}

// Coder is a running coderd with an in-process Terraform (OpenTofu)
// provisioner, backed by PostgreSQL.
type Coder struct {
	URL *url.URL
	// Client is authenticated as the first user (nil with SkipFirstUser).
	Client *codersdk.Client
	// SessionToken is the first user's session token ("" with SkipFirstUser).
	SessionToken string
	// OrganizationID is the default organization (zero with SkipFirstUser).
	OrganizationID uuid.UUID
	// Username, Email and Password are the first user's credentials (empty
	// with SkipFirstUser).
	Username, Email, Password string
	// DataDir holds coderd's cache, config, home directory and log; Stop
	// removes it.
	DataDir string
	// DatabaseURL is the database coderd uses.
	DatabaseURL string
	// Postgres is the server holding the database (nil with PostgresURL).
	Postgres *Postgres
	Process  *Process

	ownsPostgres bool
	stopOnce     sync.Once
	// What StartServer needs to run coderd again as it ran first.
	coderBin     string
	env          []string
	host         string
	args         []string
	startTimeout time.Duration
}

// StartCoder starts PostgreSQL (unless opts supplies one) and coderd on
// loopback, waits until coderd answers, and creates the first user unless
// opts.SkipFirstUser. coderd never needs the network: telemetry, update
// checks and STUN are off, and Terraform is the pinned OpenTofu in bin/.
func StartCoder(ctx context.Context, opts CoderOptions) (*Coder, error) {
	Sweep()
	// Resolve the binaries first: a missing one should fail at once, not
	// after a database has been set up.
	coderBin, err := Binary("coder")
	if err != nil {
		return nil, err
	}
	if _, err := Binary("terraform"); err != nil {
		// Without it coderd would try to download Terraform.
		return nil, err
	}
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := newStackDir("coder")
	if err != nil {
		return nil, err
	}
	c := &Coder{DataDir: dir}
	if err := c.start(ctx, opts, coderBin, binDir); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Coder) start(ctx context.Context, opts CoderOptions, coderBin, binDir string) error {
	switch {
	case opts.PostgresURL != "":
		c.DatabaseURL = opts.PostgresURL
	case opts.Postgres != nil:
		c.Postgres = opts.Postgres
		db, err := opts.Postgres.CreateDatabase(ctx, "coder_"+randomHex(6))
		if err != nil {
			return fmt.Errorf("start coderd: %w", err)
		}
		c.DatabaseURL = db
	default:
		pg, err := StartPostgres(ctx, PostgresOptions{})
		if err != nil {
			return fmt.Errorf("start coderd: %w", err)
		}
		c.Postgres, c.ownsPostgres = pg, true
		db, err := pg.CreateDatabase(ctx, "coder")
		if err != nil {
			return fmt.Errorf("start coderd: %w", err)
		}
		c.DatabaseURL = db
	}

	env, err := c.environment(binDir)
	if err != nil {
		return err
	}
	env = append(env, opts.Env...)
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = defaultCoderStartTimeout
	}
	c.coderBin, c.env, c.args, c.startTimeout = coderBin, env, opts.serverArgs(), timeout
	c.host = opts.Host
	if c.host == "" {
		c.host = "127.0.0.1"
	}
	// FreePort leaves a window in which another process can take the port;
	// on that (rare) race, try again with a new one.
	for attempt := 1; ; attempt++ {
		port := opts.HTTPPort
		if port == 0 {
			if port, err = freePortOn(c.host); err != nil {
				return err
			}
		}
		err = c.startServer(ctx, coderBin, env, port, timeout)
		if err == nil {
			break
		}
		if opts.HTTPPort != 0 || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
	}

	if opts.SkipFirstUser {
		return nil
	}
	return c.createFirstUser(ctx)
}

// environment is coderd's environment: the caller's, minus anything that
// configures Coder or Terraform, with every directory coderd and tofu
// write to inside DataDir.
func (c *Coder) environment(binDir string) ([]string, error) {
	home := filepath.Join(c.DataDir, "home")
	for _, d := range []string{home, filepath.Join(c.DataDir, "cache"), filepath.Join(c.DataDir, "config")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("start coderd: %w", err)
		}
	}
	// A CLI config of our own: without one tofu warns about the missing
	// ~/.terraformrc before its version JSON, coderd fails to parse that
	// and falls back to downloading Terraform. It installs providers only
	// from the mirror `make tools` fills (Coder's provider): nothing may
	// come from a registry.
	tfrc := filepath.Join(c.DataDir, "terraform.rc")
	if err := os.WriteFile(tfrc, []byte(terraformCLIConfig(binDir)), 0o644); err != nil {
		return nil, fmt.Errorf("start coderd: %w", err)
	}
	env := FilterEnv(os.Environ(), "CODER_", "TF_", "PATH=", "HOME=", "XDG_")
	return append(env,
		// bin/ first, so `terraform` is the pinned OpenTofu.
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+home,
		"XDG_CACHE_HOME="+filepath.Join(home, ".cache"),
		"XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"TF_CLI_CONFIG_FILE="+tfrc,
		"CODER_CACHE_DIRECTORY="+filepath.Join(c.DataDir, "cache"),
		"CODER_CONFIG_DIR="+filepath.Join(c.DataDir, "config"),
	), nil
}

// ProviderMirror is the directory of Terraform providers `make tools`
// builds (an unpacked filesystem mirror), under binDir.
func ProviderMirror(binDir string) string { return filepath.Join(binDir, "tfproviders") }

// terraformCLIConfig is OpenTofu's CLI configuration for coderd's
// provisioner: providers come from ProviderMirror only.
func terraformCLIConfig(binDir string) string {
	return fmt.Sprintf("provider_installation {\n  filesystem_mirror {\n    path    = %q\n    include = [\"*/*/*\"]\n  }\n}\n", ProviderMirror(binDir))
}

// startServer runs `coder server` on port and waits until it is the one
// answering there.
func (c *Coder) startServer(ctx context.Context, coderBin string, env []string, port int, timeout time.Duration) error {
	addr := net.JoinHostPort(c.host, strconv.Itoa(port))
	c.URL = &url.URL{Scheme: "http", Host: addr}
	cmd := exec.Command(coderBin, "server",
		"--postgres-url", c.DatabaseURL,
		"--http-address", addr,
		"--access-url", c.URL.String(),
		// Nothing may leave the machine: no telemetry, no release check,
		// no STUN servers (the default list is Google's).
		"--telemetry=false",
		"--update-check=false",
		"--derp-server-stun-addresses", "disable",
		"--oauth2-github-default-provider-enable=false",
	)
	cmd.Args = append(cmd.Args, c.args...)
	cmd.Dir = c.DataDir
	cmd.Env = env
	logPath := filepath.Join(c.DataDir, "coderd.log")
	// The log is appended to on a restart: only what this run writes
	// counts as its word that it listens.
	var logStart int64
	if fi, err := os.Stat(logPath); err == nil {
		logStart = fi.Size()
	}
	proc, err := StartProcess("coderd", cmd, logPath)
	if err != nil {
		return err
	}
	c.Process = proc
	httpClient := &http.Client{Timeout: 5 * time.Second}
	listening := "Started HTTP listener at " + c.URL.String()
	err = proc.WaitReady(ctx, timeout, func(ctx context.Context) error {
		// Another process could hold the port and answer the health
		// check: require coderd's own word that it listens there.
		if log, _ := os.ReadFile(proc.LogPath); int64(len(log)) < logStart || !bytes.Contains(log[logStart:], []byte(listening)) {
			return errors.New("coderd is not listening yet")
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL.JoinPath("healthz").String(), nil)
		if err != nil {
			return err
		}
		res, err := httpClient.Do(req)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /healthz: %s", res.Status)
		}
		return nil
	})
	if err != nil {
		// A coderd that never got ready has nothing to drain, and while it
		// retries the database it ignores SIGTERM: do not wait long.
		proc.Stop(2 * time.Second)
		return fmt.Errorf("start coderd: %w", err)
	}
	return nil
}

// createFirstUser sets up the owner account and logs in as it.
func (c *Coder) createFirstUser(ctx context.Context) error {
	c.Username = "admin"
	c.Email = "admin@example.com"
	// Random and long enough to pass coderd's password strength check.
	c.Password = "Testenv-" + randomHex(12)
	client := codersdk.New(c.URL)
	user, err := client.CreateFirstUser(ctx, codersdk.CreateFirstUserRequest{
		Email:    c.Email,
		Username: c.Username,
		Name:     "Test Admin",
		Password: c.Password,
	})
	if err != nil {
		return fmt.Errorf("create first coder user: %w", err)
	}
	login, err := client.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: c.Email, Password: c.Password})
	if err != nil {
		return fmt.Errorf("log in as first coder user: %w", err)
	}
	client.SetSessionToken(login.SessionToken)
	c.Client = client
	c.SessionToken = login.SessionToken
	c.OrganizationID = user.OrganizationID
	return nil
}

// Stop stops coderd (and its private Postgres) and removes their
// directories; it is safe to call twice.
func (c *Coder) Stop() {
	c.stopOnce.Do(func() {
		if c.Process != nil {
			// coderd drains within about two seconds; the grace covers
			// a provisioner job being canceled.
			c.Process.Stop(15 * time.Second)
		}
		if c.ownsPostgres && c.Postgres != nil {
			c.Postgres.Stop()
		}
		if c.DataDir != "" {
			removeStackDir(c.DataDir)
		}
	})
}

// StopServer stops the coderd process (SIGTERM, then SIGKILL after
// grace) and leaves its database and data directory, so that StartServer
// can bring the same coderd back: for tests of a coderd outage.
func (c *Coder) StopServer(grace time.Duration) {
	if c.Process != nil {
		c.Process.Stop(grace)
	}
}

// StartServer starts coderd again after StopServer, on the same address
// with the same database (users, tokens, templates and workspaces are
// kept), and waits until it answers.
func (c *Coder) StartServer(ctx context.Context) error {
	if c.coderBin == "" {
		return errors.New("start coderd: the Coder was not started by StartCoder")
	}
	if c.Process != nil {
		if exited, _ := c.Process.Exited(); !exited {
			return errors.New("start coderd: coderd is still running (call StopServer first)")
		}
	}
	port, err := strconv.Atoi(c.URL.Port())
	if err != nil {
		return fmt.Errorf("start coderd: port of %s: %w", c.URL, err)
	}
	// While coderd was down, an outgoing connection of any process may
	// have been given its port as the local end; such connections are
	// short-lived, so a busy port is tried again for a while.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.startServer(ctx, c.coderBin, c.env, port, c.startTimeout)
		if err == nil || !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			return err
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return fmt.Errorf("start coderd on port %d: %w", port, err)
		}
	}
}

// RestartServer stops coderd (SIGTERM, then SIGKILL after grace) and
// starts it again like StartServer, with the provisioner and rate-limit
// settings of opts (its other fields are ignored): for example to seed
// with rate limits disabled and measure with coderd's defaults.
func (c *Coder) RestartServer(ctx context.Context, grace time.Duration, opts CoderOptions) error {
	if c.coderBin == "" {
		return errors.New("restart coderd: the Coder was not started by StartCoder")
	}
	c.StopServer(grace)
	c.args = opts.serverArgs()
	return c.StartServer(ctx)
}

// NewCoder starts a Coder for a test and stops it when the test ends. It
// fails the test (never skips it) if the stack cannot start.
func NewCoder(t testing.TB, opts CoderOptions) *Coder {
	t.Helper()
	c, err := StartCoder(t.Context(), opts)
	if err != nil {
		t.Fatalf("start coder: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The directories and their logs are about to go: keep the tails.
			if c.Process != nil {
				t.Logf("coderd log tail:\n%s", c.Process.LogTail(50))
			}
			if c.ownsPostgres && c.Postgres.Process != nil {
				t.Logf("postgres log tail:\n%s", c.Postgres.Process.LogTail(20))
			}
		}
		c.Stop()
	})
	return c
}

func isNotFound(err error) bool {
	var sdkErr *codersdk.Error
	return errors.As(err, &sdkErr) && sdkErr.StatusCode() == http.StatusNotFound
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// randomHex returns 2n random hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}
