package storage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/metrics"
)

// The promoter finishes templates' background builds: for every record
// with a build still running it polls the version in Coder (on the
// templateBuildWait schedule) and, once the import succeeded, makes it
// the template's active version and clears the build; a failed import is
// recorded (Failed, Coder's error, the end of the log) and the active
// version stays; an import running past templateBuildWait.timeout is
// canceled and recorded as failed.
//
// Every replica runs it; there is no leader. The build lives only in the
// record, so a restart or another replica carries on where one stopped.
// Replicas claim each outcome through the record's optimistic
// concurrency: the write that ends a build names the resourceVersion it
// read, so exactly one replica records it and the others find the build
// gone on their next pass. Promotion itself is idempotent (make version V
// active, then read the template back to check it is), so a replica that
// dies between promoting and clearing the build leaves work that the next
// pass repeats harmlessly: each build is promoted once and yields exactly
// one new active version.

// promoterMaxCheck bounds one build check's calls to coderd, so one slow
// coderd does not hold up the other builds for long.
const promoterMaxCheck = 30 * time.Second

// buildSchedule is when a build is next polled.
type buildSchedule struct {
	next     time.Time
	interval time.Duration
}

// runPromoter runs the promoter until ctx ends. Reads come from the
// records informer; each pass looks only at records with a running build.
func (s *TemplateStorage) runPromoter(ctx context.Context) {
	if s.records.store == nil {
		return
	}
	wake := make(chan struct{}, 1)
	if err := s.records.store.OnChange(ctx, func(r *records.Record, deleted bool) {
		if !deleted && r.Spec.Resource == coderv1alpha1.RecordResourceTemplates && r.Spec.Build != nil && !r.Spec.Build.Failed {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}); err != nil {
		// Builds are still found by the periodic pass.
		s.log.Error(err, "template build promoter: no record events")
	}
	tick := s.opts.BuildWait.InitialPollInterval
	if tick <= 0 {
		tick = 2 * time.Second
	}
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	schedule := map[string]buildSchedule{}
	for {
		s.promotePass(ctx, schedule)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-wake:
		}
	}
}

// promotePass checks every running build that is due.
func (s *TemplateStorage) promotePass(ctx context.Context, schedule map[string]buildSchedule) {
	ts, err := s.targets(ctx, "")
	if err != nil {
		s.log.V(1).Info("template build promoter: no backends", "error", err.Error())
		return
	}
	seen := map[string]bool{}
	now := time.Now()
	for _, t := range ts {
		recs, err := s.records.list(ctx, t.Namespace, coderv1alpha1.RecordResourceTemplates, t.ControlPlane)
		if err != nil {
			s.log.Error(err, "template build promoter: list records", "namespace", t.Namespace)
			continue
		}
		for _, rec := range recs {
			b := rec.Spec.Build
			if b == nil || b.Failed {
				continue
			}
			key := rec.Namespace + "/" + rec.Name + "/" + b.VersionID
			seen[key] = true
			due, ok := schedule[key]
			if ok && now.Before(due.next) {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, promoterMaxCheck)
			done := s.checkBuild(cctx, t, rec)
			cancel()
			if done {
				delete(schedule, key)
				continue
			}
			interval := s.opts.BuildWait.NextInterval(time.Since(b.StartedAt.Time), due.interval)
			schedule[key] = buildSchedule{next: time.Now().Add(interval), interval: interval}
		}
	}
	for k := range schedule {
		if !seen[k] {
			delete(schedule, k)
		}
	}
}

// checkBuild polls one build and finishes it when its import has ended
// (or run too long). It reports whether the build needs no more polling
// from this pass's view.
func (s *TemplateStorage) checkBuild(ctx context.Context, t target, rec *records.Record) bool {
	b := rec.Spec.Build
	log := s.log.WithValues("namespace", rec.Namespace, "template", rec.Spec.Name, "templateVersion", b.VersionID)
	versionID, err1 := uuid.Parse(b.VersionID)
	templateID, err2 := uuid.Parse(rec.Spec.CoderID)
	if err := errors.Join(err1, err2); err != nil {
		log.Error(err, "template build promoter: malformed record; dropping its build")
		return s.endBuild(ctx, rec, nil, log)
	}
	v, done, err := templatesource.Poll(ctx, t.Client, versionID)
	var failed *templatesource.BuildFailedError
	switch {
	case errors.As(err, &failed):
		outcome := metrics.BuildFailed
		if failed.Status == codersdk.ProvisionerJobCanceled {
			outcome = metrics.BuildCanceled
		}
		nb := b.DeepCopy()
		nb.Failed, nb.Error, nb.Log = true, failed.Message, failed.Logs
		if s.endBuild(ctx, rec, nb, log) {
			metrics.ObserveBuildWait(outcome, time.Since(b.StartedAt.Time))
			log.Info("template build did not succeed; the active version stays", "error", failed.Message)
		}
		return true
	case coderapi.IsNotFound(err):
		log.Info("template build promoter: the version is gone from Coder; dropping the build")
		return s.endBuild(ctx, rec, nil, log)
	case err != nil:
		log.V(1).Info("template build promoter: poll failed; retrying", "error", err.Error())
		return false
	case !done:
		if timeout := s.opts.BuildWait.Timeout; timeout > 0 && time.Since(b.StartedAt.Time) > timeout {
			s.abandonVersion(ctx, t, versionID)
			nb := b.DeepCopy()
			nb.Failed = true
			nb.Error = fmt.Sprintf("the import did not finish within %s (aggregatedAPIServer.templateBuildWait.timeout; job %s); coder-k8s canceled it",
				timeout, v.Job.Status)
			if s.endBuild(ctx, rec, nb, log) {
				metrics.ObserveBuildWait(metrics.BuildTimeout, time.Since(b.StartedAt.Time))
				log.Info("template build timed out; canceled it", "timeout", timeout.String())
			}
			return true
		}
		return false
	}
	// Built: make it active, unless it is already (a new template's first
	// version, or a promotion whose record write was lost).
	tpl, err := t.Client.Template(ctx, templateID)
	if err != nil {
		if coderapi.IsNotFound(err) {
			log.Info("template build promoter: the template is gone from Coder; dropping the build")
			return s.endBuild(ctx, rec, nil, log)
		}
		log.V(1).Info("template build promoter: read the template; retrying", "error", err.Error())
		return false
	}
	if tpl.ActiveVersionID != versionID {
		// Only if the record still asks for this build: a request may
		// have replaced it since this pass read it.
		if cur, err := s.records.get(ctx, records.KeyOf(rec)); err != nil || cur == nil || cur.Spec.Build == nil || cur.Spec.Build.VersionID != b.VersionID {
			return false
		}
		// codersdk's UpdateActiveTemplateVersion reports success when the
		// request never reached coderd, so read the template back.
		if err := t.Client.UpdateActiveTemplateVersion(ctx, templateID, codersdk.UpdateActiveTemplateVersion{ID: versionID}); err != nil {
			log.Info("template build promoter: promote failed; retrying", "error", err.Error())
			return false
		}
		if tpl, err = t.Client.Template(ctx, templateID); err != nil || tpl.ActiveVersionID != versionID {
			log.Info("template build promoter: the promotion did not take; retrying", "error", fmt.Sprint(err))
			return false
		}
	}
	if s.endBuild(ctx, rec, nil, log) {
		metrics.ObserveBuildWait(metrics.BuildSucceeded, time.Since(b.StartedAt.Time))
		log.Info("template build succeeded; it is the active version")
	}
	return true
}

// endBuild claims a build's outcome: it writes nb (nil clears the build)
// to the record read as rec, with rec's resourceVersion. It reports
// whether this write won; a conflict means another replica or a request
// changed the record first, and the next pass looks again.
func (s *TemplateStorage) endBuild(ctx context.Context, rec *records.Record, nb *coderv1alpha1.TemplateBuildRecord, log logr.Logger) bool {
	out := rec.DeepCopy()
	out.Spec.Build = nb
	if err := s.records.save(ctx, out, records.KeyOf(rec)); err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			log.Error(err, "template build promoter: record the build's outcome")
		}
		return false
	}
	return true
}
