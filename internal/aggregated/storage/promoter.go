package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
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
	var refresh staleBuilds
	if err := s.records.store.OnChange(ctx, func(r *records.Record, deleted bool) {
		if deleted || r.Spec.Resource != coderv1alpha1.RecordResourceTemplates {
			return
		}
		if r.Spec.Build == nil || r.Spec.Build.Failed {
			if !s.buildShownStale(r) {
				return
			}
			refresh.add(records.KeyOf(r))
		}
		select {
		case wake <- struct{}{}:
		default:
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
		s.refreshBuilds(ctx, refresh.take())
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

// A build that ended (promoted, failed, or dropped) changes only the
// template's record, and what the watch cache shows of the build comes
// from Coder's versions, which the record change alone does not re-read.
// Every replica's promoter therefore reads such a template again from
// Coder as soon as its record changes, instead of at the next poll.

// staleBuilds are the templates whose shown build an ended build made
// stale, filled by record events and drained by the promoter.
type staleBuilds struct {
	mu   sync.Mutex
	keys map[records.Key]bool
}

func (b *staleBuilds) add(k records.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.keys == nil {
		b.keys = map[records.Key]bool{}
	}
	b.keys[k] = true
}

func (b *staleBuilds) take() map[records.Key]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	keys := b.keys
	b.keys = nil
	return keys
}

// buildShownStale reports whether the cached template of rec, a record
// without a running build, still shows a build running (or a failure the
// record no longer has, or no failure where it has one).
func (s *TemplateStorage) buildShownStale(rec *records.Record) bool {
	o := s.cachedByUID(rec.Namespace+"/"+rec.Spec.ControlPlane, rec.Spec.Name, rec.Spec.CoderID)
	obj, ok := o.(*aggv1.CoderTemplate)
	if !ok {
		return false
	}
	reason := readyCondition(obj).Reason
	if rec.Spec.Build != nil { // failed
		return reason != aggv1.ReasonBuildFailed
	}
	// Building without a build in the record: a new template's first
	// version, shown as it was before it built (or a template made in
	// Coder whose active version still imports; reading it again is
	// harmless).
	return obj.Status.BuildingVersionID != "" || reason == aggv1.ReasonBuildFailed || reason == aggv1.ReasonBuilding
}

// refreshBuilds reads the templates of keys from Coder again and puts
// them in the watch cache. A template that cannot be read now is left to
// the next poll.
func (s *TemplateStorage) refreshBuilds(ctx context.Context, keys map[records.Key]bool) {
	for k := range keys {
		ts, err := s.targets(ctx, k.Namespace)
		if err != nil {
			continue
		}
		for _, t := range ts {
			if t.ControlPlane != k.ControlPlane {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, promoterMaxCheck)
			if err := s.refreshTemplate(cctx, t, k.CoderID); err != nil {
				s.log.V(1).Info("template build promoter: re-read the template after its build ended; the next poll will", "namespace", k.Namespace, "template", k.CoderID, "error", err.Error())
			}
			cancel()
		}
	}
}

func (s *TemplateStorage) refreshTemplate(ctx context.Context, t target, coderID string) error {
	id, err := uuid.Parse(coderID)
	if err != nil {
		return err
	}
	tpl, err := t.Client.Template(ctx, id)
	if err != nil {
		return err
	}
	obj, err := s.convert(ctx, t, &tpl)
	if err != nil {
		return err
	}
	_, err = s.publishRead(ctx, t, obj)
	return err
}
