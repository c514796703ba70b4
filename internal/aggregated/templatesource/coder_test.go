package templatesource

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/metrics/metricstest"
	"github.com/coder/coder-k8s/internal/testenv"
)

// fastWait polls often so that builds of about a second are seen quickly.
var fastWait = WaitConfig{
	Timeout:             90 * time.Second,
	BackoffAfter:        5 * time.Second,
	InitialPollInterval: 50 * time.Millisecond,
	MaxPollInterval:     500 * time.Millisecond,
}

// unmatchedTags are provisioner tags no provisioner of the test coderd
// has: a version created with them stays pending, deterministically.
var unmatchedTags = map[string]string{"coder-k8s-test": "no-such-provisioner"}

// countingTransport counts file downloads and can fail template version
// polls, in front of the real coderd.
type countingTransport struct {
	downloads atomic.Int64
	// failPolls is how many GET /api/v2/templateversions/{id} requests
	// to fail: the first with a network error, the rest with a 503.
	failPolls atomic.Int64
	failed    atomic.Int64
	// downloadDelay (nanoseconds) holds each download back, so that
	// concurrent callers overlap.
	downloadDelay atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, "/api/v2/files/") {
		c.downloads.Add(1)
		if d := time.Duration(c.downloadDelay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-req.Context().Done():
				return nil, req.Context().Err()
			}
		}
	}
	if req.Method == http.MethodGet && strings.HasPrefix(req.URL.Path, "/api/v2/templateversions/") &&
		strings.Count(req.URL.Path, "/") == 4 && c.failPolls.Add(-1) >= 0 {
		if c.failed.Add(1) == 1 {
			return nil, errors.New("injected: connection reset by peer")
		}
		return &http.Response{
			StatusCode: http.StatusServiceUnavailable,
			Status:     "503 Service Unavailable",
			Header:     http.Header{"Content-Type": []string{"application/json"}},
			Body:       io.NopCloser(strings.NewReader(`{"message":"injected: coderd is restarting"}`)),
			Request:    req,
		}, nil
	}
	return http.DefaultTransport.RoundTrip(req)
}

func clientWith(coder *testenv.Coder, rt http.RoundTripper, token string) *codersdk.Client {
	c := codersdk.New(coder.URL, codersdk.WithHTTPClient(&http.Client{Transport: rt, Timeout: 30 * time.Second}))
	c.SetSessionToken(token)
	return c
}

// createVersion uploads files and creates a template version from them.
func createVersion(ctx context.Context, t *testing.T, coder *testenv.Coder, files map[string]string, tags map[string]string) codersdk.TemplateVersion {
	t.Helper()
	fileID, err := Upload(ctx, coder.Client, files, DefaultLimits)
	if err != nil {
		t.Fatalf("Upload() error = %v", err)
	}
	v, err := coder.Client.CreateTemplateVersion(ctx, coder.OrganizationID, codersdk.CreateTemplateVersionRequest{
		StorageMethod:   codersdk.ProvisionerStorageMethodFile,
		FileID:          fileID,
		Provisioner:     codersdk.ProvisionerTypeTerraform,
		ProvisionerTags: tags,
	})
	if err != nil {
		t.Fatalf("create template version: %v", err)
	}
	return v
}

// createPendingVersion creates a version no provisioner will take, and
// cancels it when the test ends.
func createPendingVersion(ctx context.Context, t *testing.T, coder *testenv.Coder) codersdk.TemplateVersion {
	t.Helper()
	v := createVersion(ctx, t, coder, testenv.ProviderFreeTemplate(), unmatchedTags)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Already canceled is fine; the job must not outlive the test.
		_ = coder.Client.CancelTemplateVersion(ctx, v.ID)
	})
	return v
}

// fakeClock runs the polling schedule at once and records its pauses.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

// TestAgainstCoderd runs the package against one real coderd with the
// OpenTofu provisioner; subtests share it and run in parallel.
func TestAgainstCoderd(t *testing.T) {
	coder := testenv.NewCoder(t, testenv.CoderOptions{})
	// Every wait below is counted by outcome, as /metrics shows; checked
	// once the (parallel) subtests are done.
	before := buildWaits(t)
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		after := buildWaits(t)
		for outcome, want := range map[string]float64{"succeeded": 2, "failed": 1, "timeout": 1, "canceled": 2, "error": 2} {
			if got := after[outcome] - before[outcome]; got != want {
				t.Errorf("coder_k8s_template_build_wait_duration_seconds{outcome=%q}: %v more waits, want %v", outcome, got, want)
			}
		}
	})

	t.Run("BuildSucceeds", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		files := testenv.ProviderFreeTemplate()
		first, err := Upload(ctx, coder.Client, files, DefaultLimits)
		if err != nil {
			t.Fatalf("Upload() error = %v", err)
		}
		// A deterministic archive lets coderd deduplicate the upload.
		if again, err := Upload(ctx, coder.Client, maps.Clone(files), DefaultLimits); err != nil || again != first {
			t.Fatalf("Upload() of the same files again = %s, %v; want the same file ID %s", again, err, first)
		}
		v, err := coder.Client.CreateTemplateVersion(ctx, coder.OrganizationID, codersdk.CreateTemplateVersionRequest{
			StorageMethod: codersdk.ProvisionerStorageMethodFile,
			FileID:        first,
			Provisioner:   codersdk.ProvisionerTypeTerraform,
		})
		if err != nil {
			t.Fatalf("create template version: %v", err)
		}
		got, err := WaitForBuild(ctx, coder.Client, v.ID, fastWait)
		if err != nil {
			t.Fatalf("WaitForBuild() error = %v", err)
		}
		if got.ID != v.ID || got.Job.Status != codersdk.ProvisionerJobSucceeded || got.Job.FileID != first {
			t.Errorf("WaitForBuild() = version %s, job %s, file %s; want %s, succeeded, %s", got.ID, got.Job.Status, got.Job.FileID, v.ID, first)
		}
	})

	t.Run("BuildFails", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		v := createVersion(ctx, t, coder, map[string]string{"main.tf": "this is not terraform {\n"}, nil)
		_, err := WaitForBuild(ctx, coder.Client, v.ID, fastWait)
		var failed *BuildFailedError
		if !errors.As(err, &failed) {
			t.Fatalf("WaitForBuild() error = %v, want a *BuildFailedError", err)
		}
		// Coder's own account of the failure, and Terraform's words in the log.
		after, getErr := coder.Client.TemplateVersion(ctx, v.ID)
		if getErr != nil {
			t.Fatal(getErr)
		}
		if failed.VersionID != v.ID || failed.Status != codersdk.ProvisionerJobFailed || failed.Message != after.Job.Error || failed.Message == "" {
			t.Errorf("BuildFailedError = %+v, want version %s, status failed, message %q", failed, v.ID, after.Job.Error)
		}
		for _, want := range []string{"Error: Unclosed configuration block", "on main.tf line 1"} {
			if !strings.Contains(failed.Logs, want) {
				t.Errorf("BuildFailedError.Logs = %q, want Terraform's parse error (%q)", failed.Logs, want)
			}
		}
		if !strings.Contains(err.Error(), failed.Message) || !strings.Contains(err.Error(), "Unclosed configuration block") {
			t.Errorf("BuildFailedError.Error() = %q, want the job's error and the log tail", err)
		}
		if n := strings.Count(failed.Logs, "\n") + 1; n > logTailLines {
			t.Errorf("BuildFailedError.Logs has %d lines, want at most %d", n, logTailLines)
		}
		t.Logf("build failure: %v", err)
	})

	t.Run("TimesOutWhileNoProvisionerTakesTheJob", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		v := createPendingVersion(ctx, t, coder)
		cfg := WaitConfig{Timeout: time.Second, BackoffAfter: 300 * time.Millisecond, InitialPollInterval: 100 * time.Millisecond, MaxPollInterval: 300 * time.Millisecond}
		start := time.Now()
		_, err := WaitForBuild(ctx, coder.Client, v.ID, cfg)
		elapsed := time.Since(start)
		var timeout *BuildTimeoutError
		if !errors.As(err, &timeout) {
			t.Fatalf("WaitForBuild() error = %v, want a *BuildTimeoutError", err)
		}
		if timeout.VersionID != v.ID || timeout.Timeout != time.Second || timeout.LastStatus != codersdk.ProvisionerJobPending {
			t.Errorf("BuildTimeoutError = %+v, want version %s, timeout 1s, last status pending", timeout, v.ID)
		}
		if elapsed < time.Second || elapsed > 5*time.Second {
			t.Errorf("WaitForBuild() gave up after %s, want about 1s", elapsed)
		}

		// Canceled, the same job ends the wait with a BuildFailedError.
		if err := coder.Client.CancelTemplateVersion(ctx, v.ID); err != nil {
			t.Fatalf("cancel template version: %v", err)
		}
		_, err = WaitForBuild(ctx, coder.Client, v.ID, fastWait)
		var failed *BuildFailedError
		if !errors.As(err, &failed) || failed.Status != codersdk.ProvisionerJobCanceled {
			t.Fatalf("WaitForBuild() after cancel = %v, want a *BuildFailedError with status canceled", err)
		}
	})

	t.Run("BackoffSchedule", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		v := createPendingVersion(ctx, t, coder)
		cfg := WaitConfig{Timeout: 10 * time.Second, BackoffAfter: time.Second, InitialPollInterval: 200 * time.Millisecond, MaxPollInterval: 3 * time.Second}
		clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		_, err := waitForBuild(ctx, coder.Client, v.ID, cfg, clk)
		var timeout *BuildTimeoutError
		if !errors.As(err, &timeout) {
			t.Fatalf("waitForBuild() error = %v, want a *BuildTimeoutError", err)
		}
		ms := time.Millisecond
		// 200ms until 1s has passed, then doubling to the 3s cap, the last
		// pause cut short by the 10s timeout.
		want := []time.Duration{200 * ms, 200 * ms, 200 * ms, 200 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3000 * ms, 3000 * ms, 200 * ms}
		if !reflect.DeepEqual(clk.sleeps, want) {
			t.Errorf("poll pauses = %v, want %v", clk.sleeps, want)
		}
	})

	t.Run("StopsWhenContextEnds", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		v := createPendingVersion(ctx, t, coder)
		waitCtx, stop := context.WithCancel(ctx)
		time.AfterFunc(300*time.Millisecond, stop)
		start := time.Now()
		_, err := WaitForBuild(waitCtx, coder.Client, v.ID, fastWait)
		var timeout *BuildTimeoutError
		if !errors.Is(err, context.Canceled) || errors.As(err, &timeout) {
			t.Fatalf("WaitForBuild() error = %v, want context.Canceled, not a timeout", err)
		}
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("WaitForBuild() returned %s after the context ended, want promptly", elapsed)
		}
	})

	t.Run("RetriesTransientErrors", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		v := createVersion(ctx, t, coder, testenv.ProviderFreeTemplate(), nil)
		rt := &countingTransport{}
		rt.failPolls.Store(3)
		got, err := WaitForBuild(ctx, clientWith(coder, rt, coder.SessionToken), v.ID, fastWait)
		if err != nil {
			t.Fatalf("WaitForBuild() through a network error and 503s = %v, want success", err)
		}
		if got.Job.Status != codersdk.ProvisionerJobSucceeded || rt.failed.Load() != 3 {
			t.Errorf("WaitForBuild() = job %s after %d injected failures, want succeeded after 3", got.Job.Status, rt.failed.Load())
		}
	})

	t.Run("ClientErrorsFailAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		v := createPendingVersion(ctx, t, coder)
		tests := []struct {
			name   string
			client *codersdk.Client
			id     uuid.UUID
			status int
		}{
			{name: "unknown version", client: coder.Client, id: uuid.New(), status: http.StatusNotFound},
			{name: "bad token", client: clientWith(coder, http.DefaultTransport, "bad-token"), id: v.ID, status: http.StatusUnauthorized},
		}
		for _, tt := range tests {
			start := time.Now()
			_, err := WaitForBuild(ctx, tt.client, tt.id, fastWait)
			var sdkErr *codersdk.Error
			if !errors.As(err, &sdkErr) || sdkErr.StatusCode() != tt.status {
				t.Errorf("%s: WaitForBuild() error = %v, want HTTP %d from coderd", tt.name, err, tt.status)
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("%s: WaitForBuild() took %s, want it to fail at once", tt.name, elapsed)
			}
		}
	})

	t.Run("SourceCache", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		files := map[string]string{
			"main.tf":             testenv.ProviderFreeTemplate()["main.tf"],
			"README.md":           "# Source cache test\n",
			"scripts/setup.sh":    "#!/bin/sh\necho setup\n",
			"modules/m/vars.tf":   "variable \"z\" {}\n",
			"modules/m/README.md": "ünïcödé\n",
		}
		fileID, err := Upload(ctx, coder.Client, files, DefaultLimits)
		if err != nil {
			t.Fatalf("Upload() error = %v", err)
		}
		rt := &countingTransport{}
		client := clientWith(coder, rt, coder.SessionToken)
		cache := NewSourceCache(1 << 20)

		got, err := cache.Files(ctx, client.URL.String(), client, fileID, DefaultLimits)
		if err != nil {
			t.Fatalf("Files() error = %v", err)
		}
		if !reflect.DeepEqual(got, files) || rt.downloads.Load() != 1 {
			t.Fatalf("Files() = %q after %d downloads, want %q after 1", got, rt.downloads.Load(), files)
		}
		got["main.tf"] = "changed by the caller"
		again, err := cache.Files(ctx, client.URL.String(), client, fileID, DefaultLimits)
		if err != nil {
			t.Fatalf("Files() error = %v", err)
		}
		if !reflect.DeepEqual(again, files) || rt.downloads.Load() != 1 {
			t.Errorf("second Files() = %q after %d downloads, want the original files from the cache (1 download)", again, rt.downloads.Load())
		}

		// Concurrent misses share one download: it is held back long
		// enough for all of them to arrive while it runs.
		rt.downloads.Store(0)
		rt.downloadDelay.Store(int64(300 * time.Millisecond))
		fresh := NewSourceCache(1 << 20)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				got, err := fresh.Files(ctx, client.URL.String(), client, fileID, DefaultLimits)
				if err == nil && !reflect.DeepEqual(got, files) {
					err = errors.New("wrong files")
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Files() error = %v", err)
			}
		}
		if n := rt.downloads.Load(); n != 1 {
			t.Errorf("8 concurrent Files() made %d downloads, want 1", n)
		}

		// A caller whose context ends mid-download does not fail the
		// callers waiting on it: one of them downloads again.
		rt.downloads.Store(0)
		abandoned := NewSourceCache(1 << 20)
		leaderCtx, leaderCancel := context.WithCancel(ctx)
		leaderDone := make(chan error, 1)
		go func() {
			_, err := abandoned.Files(leaderCtx, client.URL.String(), client, fileID, DefaultLimits)
			leaderDone <- err
		}()
		for rt.downloads.Load() == 0 { // the leader's download is under way
			time.Sleep(5 * time.Millisecond)
		}
		waiterDone := make(chan error, 1)
		go func() {
			got, err := abandoned.Files(ctx, client.URL.String(), client, fileID, DefaultLimits)
			if err == nil && !reflect.DeepEqual(got, files) {
				err = errors.New("wrong files")
			}
			waiterDone <- err
		}()
		time.Sleep(50 * time.Millisecond) // let the waiter join the download
		leaderCancel()
		if err := <-leaderDone; !errors.Is(err, context.Canceled) {
			t.Errorf("Files() with a canceled context error = %v, want context.Canceled", err)
		}
		if err := <-waiterDone; err != nil {
			t.Errorf("Files() waiting on an abandoned download error = %v, want the files", err)
		}
		if n := rt.downloads.Load(); n != 2 {
			t.Errorf("abandoned download then retry made %d downloads, want 2", n)
		}
		rt.downloadDelay.Store(0)

		// An unknown file is coderd's 404, and is not cached.
		rt.downloads.Store(0)
		missing := uuid.New()
		for range 2 {
			_, err := fresh.Files(ctx, client.URL.String(), client, missing, DefaultLimits)
			var sdkErr *codersdk.Error
			if !errors.As(err, &sdkErr) || sdkErr.StatusCode() != http.StatusNotFound {
				t.Errorf("Files(unknown ID) error = %v, want coderd's 404", err)
			}
		}
		if n := rt.downloads.Load(); n != 2 {
			t.Errorf("two Files(unknown ID) made %d downloads, want 2 (errors are not cached)", n)
		}

		// A source that fails to extract (here: larger than the limits
		// allow) is downloaded once, however often it is asked for: the
		// file ID is immutable, so the answer cannot change.
		rt.downloads.Store(0)
		tooBig := Limits{MaxFiles: 1000, MaxFileBytes: 8, MaxTotalBytes: 1 << 20}
		negative := NewSourceCache(1 << 20)
		var firstErr error
		for i := range 5 {
			_, err := negative.Files(ctx, client.URL.String(), client, fileID, tooBig)
			if err == nil || !strings.Contains(err.Error(), "extract template source "+fileID.String()) {
				t.Fatalf("Files() of a too big source, call %d: error = %v, want the extraction error", i+1, err)
			}
			if i == 0 {
				firstErr = err
			} else if err.Error() != firstErr.Error() {
				t.Errorf("Files() call %d error = %q, want the first error %q again", i+1, err, firstErr)
			}
		}
		if n := rt.downloads.Load(); n != 1 {
			t.Errorf("5 Files() of a source that fails to extract made %d downloads, want 1", n)
		}

		// A budget for one source evicts the least recently used.
		otherFiles := map[string]string{"main.tf": "locals { other = true }\n"}
		other, err := Upload(ctx, coder.Client, otherFiles, DefaultLimits)
		if err != nil {
			t.Fatalf("Upload() error = %v", err)
		}
		rt.downloads.Store(0)
		small := NewSourceCache(max(sourceSize(files), sourceSize(otherFiles)))
		for _, id := range []uuid.UUID{fileID, other, fileID} {
			if _, err := small.Files(ctx, client.URL.String(), client, id, DefaultLimits); err != nil {
				t.Fatalf("Files(%s) error = %v", id, err)
			}
		}
		if n := rt.downloads.Load(); n != 3 {
			t.Errorf("A, B, A through a one-source cache made %d downloads, want 3", n)
		}
	})

	t.Run("ExtractsCoderdZip", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		files := map[string]string{"main.tf": "locals { zip = true }\n", "sub/dir/notes.txt": "zipped\n"}
		fileID, err := Upload(ctx, coder.Client, files, DefaultLimits)
		if err != nil {
			t.Fatalf("Upload() error = %v", err)
		}
		data, contentType, err := coder.Client.DownloadWithFormat(ctx, fileID, codersdk.FormatZip)
		if err != nil {
			t.Fatalf("download as zip: %v", err)
		}
		if contentType != codersdk.ContentTypeZip {
			t.Fatalf("download as zip: content type %q, want %q", contentType, codersdk.ContentTypeZip)
		}
		got, err := Extract(data, DefaultLimits)
		if err != nil {
			t.Fatalf("Extract(coderd's zip) error = %v", err)
		}
		if !reflect.DeepEqual(got, files) {
			t.Errorf("Extract(coderd's zip) = %q, want %q", got, files)
		}
	})
}

func TestWaitForBuildRejectsUnusableConfig(t *testing.T) {
	for _, cfg := range []WaitConfig{{InitialPollInterval: time.Second}, {Timeout: time.Second}} {
		// No request is made: the client points nowhere.
		_, err := WaitForBuild(t.Context(), codersdk.New(nil), uuid.New(), cfg)
		if err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("WaitForBuild(%+v) error = %v, want a configuration error", cfg, err)
		}
	}
}

// buildWaits is the number of build waits by outcome, from /metrics.
func buildWaits(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range metricstest.Series(t, "coder_k8s_template_build_wait_duration_seconds", nil) {
		out[metricstest.Label(m, "outcome")] += float64(m.GetHistogram().GetSampleCount())
	}
	return out
}
