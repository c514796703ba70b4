package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
)

// TestCoder runs one real coderd (with its private PostgreSQL and the
// OpenTofu provisioner) through what the operator relies on, then checks
// that stopping it leaves nothing behind. Subtests share the stack where
// that does not weaken what they assert.
func TestCoder(t *testing.T) {
	start := time.Now()
	c := NewCoder(t, CoderOptions{})
	startup := time.Since(start)
	t.Logf("StartCoder (PostgreSQL + coderd + first user) took %s", startup.Round(time.Millisecond))
	if startup > 30*time.Second {
		t.Errorf("StartCoder took %s, want under 30s", startup)
	}
	if c.Client == nil || c.SessionToken == "" || c.OrganizationID.String() == "00000000-0000-0000-0000-000000000000" {
		t.Fatalf("first user not set up: client %v, token %q, organization %s", c.Client, c.SessionToken, c.OrganizationID)
	}

	t.Run("BuildInfo", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL.JoinPath("api/v2/buildinfo").String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET /api/v2/buildinfo: %v", err)
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/v2/buildinfo: %s", res.Status)
		}
		var info codersdk.BuildInfoResponse
		if err := json.NewDecoder(res.Body).Decode(&info); err != nil {
			t.Fatalf("decode buildinfo: %v", err)
		}
		if !strings.HasPrefix(info.Version, "v2.30.0") {
			t.Errorf("coderd version = %q, want v2.30.0", info.Version)
		}
	})

	t.Run("FirstUserSession", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		me, err := c.Client.User(ctx, codersdk.Me)
		if err != nil {
			t.Fatalf("get current user: %v", err)
		}
		if me.Username != c.Username || me.Email != c.Email {
			t.Errorf("session user = %s <%s>, want %s <%s>", me.Username, me.Email, c.Username, c.Email)
		}
		// The password works for a fresh login, as the operator would use it.
		if _, err := codersdk.New(c.URL).LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: c.Email, Password: c.Password}); err != nil {
			t.Errorf("log in with the first user's password: %v", err)
		}
	})

	t.Run("TemplateAndWorkspaceLifecycle", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()

		tpl, err := c.PushTemplate(ctx, "provider-free", ProviderFreeTemplate())
		if err != nil {
			t.Fatalf("push template: %v", err)
		}
		assertVersionSucceeded(ctx, t, c, tpl)

		// Pushing again adds a version and makes it the active one.
		files := ProviderFreeTemplate()
		files["modules/extra/README.md"] = "a file in a subdirectory\n"
		tpl2, err := c.PushTemplate(ctx, "provider-free", files)
		if err != nil {
			t.Fatalf("push second version: %v", err)
		}
		if tpl2.ID != tpl.ID {
			t.Errorf("second push created template %s, want a new version of %s", tpl2.ID, tpl.ID)
		}
		if tpl2.ActiveVersionID == tpl.ActiveVersionID {
			t.Errorf("second push left active version %s in place", tpl.ActiveVersionID)
		}
		assertVersionSucceeded(ctx, t, c, tpl2)

		ws, err := c.CreateWorkspace(ctx, "provider-free", "ws1")
		if err != nil {
			t.Fatalf("create workspace: %v", err)
		}
		assertBuild(t, ws, codersdk.WorkspaceTransitionStart, codersdk.WorkspaceStatusRunning)
		if ws.LatestBuild.TemplateVersionID != tpl2.ActiveVersionID {
			t.Errorf("workspace built version %s, want the active %s", ws.LatestBuild.TemplateVersionID, tpl2.ActiveVersionID)
		}

		ws, err = c.StopWorkspace(ctx, "ws1")
		if err != nil {
			t.Fatalf("stop workspace: %v", err)
		}
		assertBuild(t, ws, codersdk.WorkspaceTransitionStop, codersdk.WorkspaceStatusStopped)

		ws, err = c.StartWorkspace(ctx, "ws1")
		if err != nil {
			t.Fatalf("start workspace: %v", err)
		}
		assertBuild(t, ws, codersdk.WorkspaceTransitionStart, codersdk.WorkspaceStatusRunning)
		if ws.LatestBuild.BuildNumber != 3 {
			t.Errorf("latest build number = %d, want 3 (create, stop, start)", ws.LatestBuild.BuildNumber)
		}

		// The builds ran the pinned OpenTofu from bin/: coderd did not
		// fall back to downloading a Terraform into its cache.
		_ = filepath.WalkDir(filepath.Join(c.DataDir, "cache"), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && d.Name() == "terraform" {
				t.Errorf("coderd downloaded a Terraform: %s", p)
			}
			return nil
		})
	})

	t.Run("CoderProviderFromTheMirror", func(t *testing.T) {
		// A template using Coder's Terraform provider imports offline:
		// OpenTofu takes the provider from the mirror `make tools`
		// fills, and coderd reads the parameters and presets it declares.
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		tpl, err := c.PushTemplate(ctx, "parameters", ParameterTemplate())
		if err != nil {
			t.Fatalf("push the parameter template (is bin/tfproviders built? run `make tools`): %v", err)
		}
		params, err := c.Client.TemplateVersionRichParameters(ctx, tpl.ActiveVersionID)
		if err != nil {
			t.Fatalf("rich parameters: %v", err)
		}
		var got []string
		for _, p := range params {
			got = append(got, fmt.Sprintf("%s:%s:mutable=%t:ephemeral=%t:options=%d", p.Name, p.Type, p.Mutable, p.Ephemeral, len(p.Options)))
		}
		want := []string{
			"cpu:number:mutable=true:ephemeral=false:options=3",
			"debug:bool:mutable=true:ephemeral=true:options=0",
			"greeting:string:mutable=true:ephemeral=false:options=0",
			"home_disk_size:number:mutable=false:ephemeral=false:options=0",
			"memory:number:mutable=true:ephemeral=false:options=0",
		}
		sort.Strings(got)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("parameters coderd read:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		presets, err := c.Client.TemplateVersionPresets(ctx, tpl.ActiveVersionID)
		if err != nil {
			t.Fatalf("presets: %v", err)
		}
		var names []string
		for _, p := range presets {
			names = append(names, p.Name)
		}
		sort.Strings(names)
		if strings.Join(names, ",") != "large,small" {
			t.Errorf("presets = %v, want [large small]", names)
		}
	})

	t.Run("FailedTemplateImport", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		_, err := c.PushTemplate(ctx, "broken", map[string]string{"main.tf": "resource {\n"})
		if err == nil {
			t.Fatal("pushing invalid HCL succeeded")
		}
		t.Logf("error: %v", err)
		// The error must say what failed and carry the provisioner's logs.
		for _, want := range []string{`push template "broken"`, "import failed", "logs:\n", "Unclosed configuration block"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q:\n%v", want, err)
			}
		}
	})

	t.Run("SkipFirstUserOnSharedPostgres", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		fresh := NewCoder(t, CoderOptions{SkipFirstUser: true, Postgres: c.Postgres})
		if fresh.Client != nil || fresh.SessionToken != "" || fresh.Username != "" {
			t.Errorf("SkipFirstUser left credentials: client %v, token %q, user %q", fresh.Client, fresh.SessionToken, fresh.Username)
		}
		has, err := codersdk.New(fresh.URL).HasFirstUser(ctx)
		if err != nil {
			t.Fatalf("HasFirstUser: %v", err)
		}
		if has {
			t.Error("HasFirstUser = true on a coderd started with SkipFirstUser")
		}
		// Its own database: the first coderd's user is not visible here.
		if fresh.DatabaseURL == c.DatabaseURL {
			t.Errorf("both coderds use database %s", c.DatabaseURL)
		}

		// Stopping it must leave the shared server to its owner.
		fresh.Stop()
		if _, err := c.Client.User(ctx, codersdk.Me); err != nil {
			t.Errorf("first coderd broken after stopping a coderd sharing its PostgreSQL: %v", err)
		}
		if exited, _ := c.Postgres.Process.Exited(); exited {
			t.Error("stopping a coderd stopped the PostgreSQL it did not own")
		}
	})

	t.Run("PortInUse", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		before := coderDirs(t)

		begin := time.Now()
		_, err = StartCoder(ctx, CoderOptions{Postgres: c.Postgres, HTTPPort: port, SkipFirstUser: true})
		elapsed := time.Since(begin)
		if err == nil {
			t.Fatal("StartCoder succeeded on a port already in use")
		}
		t.Logf("error after %s: %v", elapsed.Round(time.Millisecond), err)
		for _, want := range []string{"coderd exited before it was ready", "log tail:", "127.0.0.1:" + strconv.Itoa(port), "address already in use"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q", want)
			}
		}
		if elapsed > 20*time.Second {
			t.Errorf("failing start took %s, want it to fail fast", elapsed)
		}
		if after := coderDirs(t); len(after) != len(before) {
			t.Errorf("failed start left directories behind: before %v, after %v", before, after)
		}
	})

	t.Run("UnreachableDatabase", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		// A port nobody listens on: coderd keeps retrying the database, so
		// only StartTimeout ends the wait.
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		_, err = StartCoder(ctx, CoderOptions{
			PostgresURL:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/coder?sslmode=disable", port),
			StartTimeout: 5 * time.Second,
		})
		elapsed := time.Since(begin)
		if err == nil {
			t.Fatal("StartCoder succeeded without a database")
		}
		t.Logf("error after %s: %v", elapsed.Round(time.Millisecond), err)
		for _, want := range []string{"coderd not ready after 5s", "log tail:", "ping postgres", "connection refused"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q", want)
			}
		}
		if elapsed > 20*time.Second {
			t.Errorf("failing start took %s, want about the 5s StartTimeout", elapsed)
		}
	})

	t.Run("MissingBinary", func(t *testing.T) {
		t.Setenv("CODER_K8S_BIN_DIR", t.TempDir())
		_, err := StartCoder(t.Context(), CoderOptions{})
		if err == nil {
			t.Fatal("StartCoder succeeded without a coder binary")
		}
		if !strings.Contains(err.Error(), "coder not found") || !strings.Contains(err.Error(), "make tools") {
			t.Errorf("error does not name the binary and `make tools`: %v", err)
		}
	})

	t.Run("Teardown", func(t *testing.T) {
		coderPID := c.Process.cmd.Process.Pid
		pgPID := c.Postgres.Process.cmd.Process.Pid
		pgPort := c.Postgres.Port
		c.Stop()
		c.Stop() // safe twice

		assertRefused(t, "coderd", c.URL.Host)
		assertRefused(t, "postgres", net.JoinHostPort("127.0.0.1", strconv.Itoa(pgPort)))
		for _, dir := range []string{c.DataDir, c.Postgres.DataDir} {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still exists after Stop (stat: %v)", dir, err)
			}
		}
		for _, p := range []*Process{c.Process, c.Postgres.Process} {
			if exited, _ := p.Exited(); !exited {
				t.Errorf("%s has not exited after Stop", p.Name)
			}
		}
		// Each component runs in its own process group: none of its
		// children (postgres backends, terraform) may survive either.
		for name, pgid := range map[string]int{"coderd": coderPID, "postgres": pgPID} {
			if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("process group of %s (%d) still has processes (kill 0: %v)", name, pgid, err)
			}
		}
	})
}

// TestCoderPostgres checks the PostgreSQL half on its own: databases for
// several coderds, and a Stop that leaves nothing behind.
func TestCoderPostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	pg, err := StartPostgres(ctx, PostgresOptions{})
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(pg.Stop)
	t.Logf("StartPostgres took %s", time.Since(start).Round(time.Millisecond))

	dbURL, err := pg.CreateDatabase(ctx, "app_one")
	if err != nil {
		t.Fatalf("create database: %v", err)
	}
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/app_one?sslmode=disable", pg.Port); dbURL != want {
		t.Errorf("database URL = %q, want %q", dbURL, want)
	}
	out, err := pg.psql(ctx, "app_one", "SELECT current_database()")
	if err != nil {
		t.Fatalf("connect to the new database: %v", err)
	}
	if got := strings.TrimSpace(out); got != "app_one" {
		t.Errorf("current_database() = %q, want app_one", got)
	}
	if _, err := pg.CreateDatabase(ctx, "app_one"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("creating a database twice: error %v, want PostgreSQL's \"already exists\"", err)
	}
	if _, err := pg.CreateDatabase(ctx, "bad; DROP DATABASE postgres"); err == nil {
		t.Error("CreateDatabase accepted a name that is not an identifier")
	}

	pid := pg.Process.cmd.Process.Pid
	pg.Stop()
	assertRefused(t, "postgres", net.JoinHostPort("127.0.0.1", strconv.Itoa(pg.Port)))
	if _, err := os.Stat(pg.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Stop (stat: %v)", pg.DataDir, err)
	}
	if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postgres process group %d still has processes (kill 0: %v)", pid, err)
	}
	if _, err := pg.CreateDatabase(ctx, "app_two"); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("CreateDatabase after Stop: error %v, want one saying the server is stopped", err)
	}
}

func assertVersionSucceeded(ctx context.Context, t *testing.T, c *Coder, tpl codersdk.Template) {
	t.Helper()
	v, err := c.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
	if err != nil {
		t.Fatalf("get active version of %q: %v", tpl.Name, err)
	}
	if v.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Errorf("active version of %q: import job %s (%s), want succeeded", tpl.Name, v.Job.Status, v.Job.Error)
	}
}

func assertBuild(t *testing.T, ws codersdk.Workspace, transition codersdk.WorkspaceTransition, status codersdk.WorkspaceStatus) {
	t.Helper()
	b := ws.LatestBuild
	if b.Transition != transition || b.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Errorf("workspace %s latest build: transition %s, job %s (%s); want %s, succeeded", ws.Name, b.Transition, b.Job.Status, b.Job.Error, transition)
	}
	if b.Status != status {
		t.Errorf("workspace %s status = %s, want %s", ws.Name, b.Status, status)
	}
}

func assertRefused(t *testing.T, name, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err == nil {
		conn.Close()
		t.Errorf("%s address %s still accepts connections after Stop", name, addr)
		return
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s address %s: dial error %v, want connection refused", name, addr, err)
	}
}

// coderDirs lists this process's coderd stack directories.
func coderDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(stackRoot(), strconv.Itoa(os.Getpid()), "coder-*"))
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestCoderEchoSeeding runs coderd as BenchmarkScale seeds it: the echo
// provisioner next to Terraform and rate limits off. A workspace of an
// echo template builds; RestartServer with coderd's defaults keeps the
// workspace and turns the rate limit back on, which a burst beyond it
// meets as 429 Too Many Requests.
func TestCoderEchoSeeding(t *testing.T) {
	c := NewCoder(t, CoderOptions{
		ProvisionerTypes:   []codersdk.ProvisionerType{codersdk.ProvisionerTypeTerraform, codersdk.ProvisionerTypeEcho},
		ProvisionerDaemons: 4,
		DisableRateLimits:  true,
	})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	cfg, err := c.Client.DeploymentConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Values.Provisioner.DaemonTypes.Value(); strings.Join(got, ",") != "terraform,echo" || cfg.Values.Provisioner.Daemons.Value() != 4 || !cfg.Values.RateLimit.DisableAll.Value() {
		t.Errorf("coderd runs provisioners %v x%d, rate limits disabled %v; want [terraform echo] x4, disabled",
			got, cfg.Values.Provisioner.Daemons.Value(), cfg.Values.RateLimit.DisableAll.Value())
	}
	tpl, err := c.PushEchoTemplate(ctx, "echo")
	if err != nil {
		t.Fatalf("push echo template: %v", err)
	}
	version, err := c.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
	if err != nil {
		t.Fatal(err)
	}
	if version.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Errorf("echo template version import %s, want succeeded", version.Job.Status)
	}
	ws, err := c.CreateWorkspace(ctx, "echo", "echo1")
	if err != nil {
		t.Fatalf("create workspace: %v", err)
	}
	assertBuild(t, ws, codersdk.WorkspaceTransitionStart, codersdk.WorkspaceStatusRunning)
	// Rate limits off: a burst beyond coderd's default 512 a minute passes.
	if n := burst(ctx, t, c, 600); n != 0 {
		t.Errorf("%d of 600 requests got 429 with rate limits disabled", n)
	}

	pid := c.Process.PID()
	if err := c.RestartServer(ctx, 15*time.Second, CoderOptions{}); err != nil {
		t.Fatalf("restart coderd: %v", err)
	}
	if c.Process.PID() == pid {
		t.Errorf("coderd still runs as pid %d after the restart", pid)
	}
	cfg, err = c.Client.DeploymentConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Values.Provisioner.DaemonTypes.Value(); strings.Join(got, ",") != "terraform" || cfg.Values.Provisioner.Daemons.Value() != 3 ||
		cfg.Values.RateLimit.DisableAll.Value() || cfg.Values.RateLimit.API.Value() != 512 {
		t.Errorf("restarted coderd runs provisioners %v x%d, rate limits disabled %v, API limit %d; want coderd's defaults [terraform] x3, enabled, 512",
			got, cfg.Values.Provisioner.Daemons.Value(), cfg.Values.RateLimit.DisableAll.Value(), cfg.Values.RateLimit.API.Value())
	}
	got, err := c.Client.WorkspaceByOwnerAndName(ctx, c.Username, "echo1", codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatalf("the workspace after the restart: %v", err)
	}
	if got.ID != ws.ID {
		t.Errorf("workspace echo1 is %s after the restart, want %s", got.ID, ws.ID)
	}
	if n := burst(ctx, t, c, 600); n == 0 {
		t.Error("600 requests within a minute got no 429 after the restart with coderd's default rate limit")
	}
}

// burst sends n GET /api/v2/users/me as the first user, 8 at a time, and
// returns how many got 429 Too Many Requests.
func burst(ctx context.Context, t *testing.T, c *Coder, n int) int {
	t.Helper()
	var limited, failed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			for range next {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL.JoinPath("api/v2/users/me").String(), nil)
				if err != nil {
					failed.Add(1)
					continue
				}
				req.Header.Set(codersdk.SessionTokenHeader, c.SessionToken)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_ = res.Body.Close()
				switch res.StatusCode {
				case http.StatusTooManyRequests:
					limited.Add(1)
				case http.StatusOK:
				default:
					failed.Add(1)
				}
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d requests failed", f, n)
	}
	return int(limited.Load())
}
