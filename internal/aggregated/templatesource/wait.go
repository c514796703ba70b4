package templatesource

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/metrics"
)

// WaitConfig tunes WaitForBuild: poll every InitialPollInterval until
// BackoffAfter has passed, then double the interval on each poll up to
// MaxPollInterval, and give up after Timeout.
type WaitConfig struct {
	// Timeout is how long a version may build: then WaitForBuild gives up
	// with a *BuildTimeoutError.
	Timeout time.Duration
	// BackoffAfter is how long to poll at InitialPollInterval before
	// doubling the interval.
	BackoffAfter time.Duration
	// InitialPollInterval is the first polling interval.
	InitialPollInterval time.Duration
	// MaxPollInterval caps the doubled polling interval.
	MaxPollInterval time.Duration
}

// nextInterval is the pause before the next poll, elapsed into the wait,
// after a pause of prev.
func (c WaitConfig) nextInterval(elapsed, prev time.Duration) time.Duration {
	if elapsed < c.BackoffAfter {
		return c.InitialPollInterval
	}
	return min(prev*2, max(c.MaxPollInterval, c.InitialPollInterval))
}

// logTailLines is how many of a failed build's last log lines
// BuildFailedError carries: enough for Terraform's error block.
const logTailLines = 20

// logFetchTimeout bounds fetching a failed build's logs, so a stuck log
// stream cannot hold up reporting the failure.
const logFetchTimeout = 5 * time.Second

// BuildFailedError means coderd finished a template version's build
// without success: it failed or was canceled. It is the template's fault
// (or a person's cancel), not the caller's or coderd's.
type BuildFailedError struct {
	VersionID uuid.UUID
	// Status is failed or canceled.
	Status codersdk.ProvisionerJobStatus
	// ErrorCode is coderd's code for some failures, such as
	// REQUIRED_TEMPLATE_VARIABLES; usually empty.
	ErrorCode codersdk.JobErrorCode
	// Message is the job's error as coderd reports it.
	Message string
	// Logs holds the last lines of the build's provisioner logs, one per
	// line as "stage: output"; empty when they could not be fetched.
	Logs string
}

func (e *BuildFailedError) Error() string {
	msg := fmt.Sprintf("template version %s build %s: %s", e.VersionID, e.Status, e.Message)
	if e.Logs != "" {
		msg += "\nlast log lines:\n" + e.Logs
	}
	return msg
}

// BuildTimeoutError means a template version's build did not finish within
// WaitConfig.Timeout. The build may still finish later: coderd keeps the
// job; cancel it (client.CancelTemplateVersion) if it is no longer wanted.
type BuildTimeoutError struct {
	VersionID uuid.UUID
	Timeout   time.Duration
	// LastStatus is the job status last read; empty if no poll succeeded.
	LastStatus codersdk.ProvisionerJobStatus
	// LastError is the transient error of the last poll, if it failed.
	LastError error
}

func (e *BuildTimeoutError) Error() string {
	msg := fmt.Sprintf("template version %s did not finish building within %s", e.VersionID, e.Timeout)
	if e.LastStatus != "" {
		msg += fmt.Sprintf(" (job %s)", e.LastStatus)
	}
	if e.LastError != nil {
		msg += fmt.Sprintf("; last poll failed: %v", e.LastError)
	}
	return msg
}

// clock lets tests check the polling schedule without waiting it out.
type clock interface {
	Now() time.Time
	// Sleep pauses for d, or until ctx ends (then returning its error).
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// WaitForBuild polls template version versionID until its build job
// succeeds, and returns the version. A failed or canceled job gives a
// *BuildFailedError; no result within cfg.Timeout a *BuildTimeoutError;
// the end of ctx its error, wrapped. Transient coderd errors (5xx, 429,
// network) are retried until the timeout; other 4xx (404, 401, ...) are
// returned at once.
//
// Every wait is counted and timed by outcome (internal/metrics) and logged
// with the logger of ctx: failures at info level.
func WaitForBuild(ctx context.Context, client *codersdk.Client, versionID uuid.UUID, cfg WaitConfig) (codersdk.TemplateVersion, error) {
	start := time.Now()
	v, err := waitForBuild(ctx, client, versionID, cfg, realClock{})
	d := time.Since(start)
	outcome := buildOutcome(err)
	metrics.ObserveBuildWait(outcome, d)
	log := logr.FromContextOrDiscard(ctx).WithValues("templateVersion", versionID.String(), "outcome", outcome, "duration", d)
	switch outcome {
	case metrics.BuildSucceeded:
		log.V(1).Info("template build finished")
	case metrics.BuildCanceled:
		log.Info("template build wait ended", "reason", err.Error())
	default:
		msg := err.Error()
		var failed *BuildFailedError
		if errors.As(err, &failed) {
			// Not the build's log lines: they are the template's output,
			// for the user who pushed it rather than for the operator log.
			msg = failed.Message
		}
		log.Info("template build did not succeed", "error", msg)
	}
	return v, err
}

// buildOutcome is the outcome label of a wait that returned err.
func buildOutcome(err error) string {
	var failed *BuildFailedError
	var timeout *BuildTimeoutError
	switch {
	case err == nil:
		return metrics.BuildSucceeded
	case errors.As(err, &failed) && failed.Status == codersdk.ProvisionerJobCanceled,
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Canceled in coderd, or the request that waited went away.
		return metrics.BuildCanceled
	case errors.As(err, &failed):
		return metrics.BuildFailed
	case errors.As(err, &timeout):
		return metrics.BuildTimeout
	}
	return metrics.BuildError
}

func waitForBuild(ctx context.Context, client *codersdk.Client, id uuid.UUID, cfg WaitConfig, clk clock) (codersdk.TemplateVersion, error) {
	if cfg.Timeout <= 0 || cfg.InitialPollInterval <= 0 {
		return codersdk.TemplateVersion{}, fmt.Errorf("wait for template version %s build: timeout (%s) and initial poll interval (%s) must be positive",
			id, cfg.Timeout, cfg.InitialPollInterval)
	}
	// pollCtx cuts off a poll in flight at the timeout; the clock decides
	// the schedule.
	pollCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	start := clk.Now()
	deadline := start.Add(cfg.Timeout)
	interval := cfg.InitialPollInterval
	var (
		last    codersdk.TemplateVersion
		lastErr error
	)
	ended := func() error {
		if ctx.Err() != nil {
			return fmt.Errorf("wait for template version %s build: %w", id, ctx.Err())
		}
		return &BuildTimeoutError{VersionID: id, Timeout: cfg.Timeout, LastStatus: last.Job.Status, LastError: lastErr}
	}
	for {
		v, err := client.TemplateVersion(pollCtx, id)
		switch {
		case err == nil:
			last, lastErr = v, nil
			switch v.Job.Status {
			case codersdk.ProvisionerJobSucceeded:
				return v, nil
			case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
				return v, buildFailed(ctx, client, v)
			}
		case pollCtx.Err() != nil:
			return last, ended()
		case !isTransient(err):
			return last, fmt.Errorf("get template version %s: %w", id, err)
		default:
			lastErr = err
		}
		now := clk.Now()
		if !now.Before(deadline) {
			return last, ended()
		}
		interval = cfg.nextInterval(now.Sub(start), interval)
		if err := clk.Sleep(pollCtx, min(interval, deadline.Sub(now))); err != nil {
			return last, ended()
		}
	}
}

// isTransient reports an error worth retrying: coderd overloaded or
// failing (5xx, 429, 408), or no HTTP answer at all (network errors).
func isTransient(err error) bool {
	var sdkErr *codersdk.Error
	if !errors.As(err, &sdkErr) {
		return true
	}
	code := sdkErr.StatusCode()
	return code >= 500 || code == http.StatusTooManyRequests || code == http.StatusRequestTimeout
}

func buildFailed(ctx context.Context, client *codersdk.Client, v codersdk.TemplateVersion) *BuildFailedError {
	msg := v.Job.Error
	if msg == "" {
		msg = "the job ended without an error message"
		if v.Job.Status == codersdk.ProvisionerJobCanceled {
			msg = "the build was canceled"
		}
	}
	return &BuildFailedError{
		VersionID: v.ID,
		Status:    v.Job.Status,
		ErrorCode: v.Job.ErrorCode,
		Message:   msg,
		Logs:      logTail(ctx, client, v.ID),
	}
}

// logTail returns the last logTailLines lines of a finished build's logs,
// or what arrived of them within logFetchTimeout.
func logTail(ctx context.Context, client *codersdk.Client, id uuid.UUID) string {
	ctx, cancel := context.WithTimeout(ctx, logFetchTimeout)
	defer cancel()
	logs, closer, err := client.TemplateVersionLogsAfter(ctx, id, 0)
	if err != nil {
		return ""
	}
	defer closer.Close()
	var tail []string
	for {
		select {
		case l, ok := <-logs:
			if !ok {
				return strings.Join(tail, "\n")
			}
			line := strings.TrimRight(l.Output, "\n")
			if strings.TrimSpace(line) == "" {
				continue
			}
			if l.Stage != "" {
				line = l.Stage + ": " + line
			}
			tail = append(tail, line)
			if len(tail) > logTailLines {
				tail = tail[1:]
			}
		case <-ctx.Done():
			return strings.Join(tail, "\n")
		}
	}
}

// NextInterval is the pause before the next poll of a build that started
// elapsed ago, after a pause of prev: the schedule WaitForBuild follows,
// for callers that poll builds themselves (the background promoter).
func (c WaitConfig) NextInterval(elapsed, prev time.Duration) time.Duration {
	return c.nextInterval(elapsed, max(prev, c.InitialPollInterval))
}

// Poll reads template version id once. done is false while its build
// runs; a build that ended without success gives a *BuildFailedError
// carrying the end of its log. Errors reading the version are returned
// as they are (IsTransient tells whether to retry).
func Poll(ctx context.Context, client *codersdk.Client, id uuid.UUID) (v codersdk.TemplateVersion, done bool, err error) {
	v, err = client.TemplateVersion(ctx, id)
	if err != nil {
		return v, false, fmt.Errorf("get template version %s: %w", id, err)
	}
	switch v.Job.Status {
	case codersdk.ProvisionerJobSucceeded:
		return v, true, nil
	case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
		return v, true, buildFailed(ctx, client, v)
	}
	return v, false, nil
}

// IsTransient reports an error worth retrying (see isTransient).
func IsTransient(err error) bool { return isTransient(err) }
