package storage

import (
	"context"
	"errors"
	"fmt"
	"net/url"
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

// checkBuild checks the running build of rec, the record of key, once
// and finishes it when its import has ended, or when it has run past
// templateBuildWait.timeout, whether or not coderd answers. It reports
// whether the build needs no more checks: it ended, or another replica or
// a request changed the record first (its event queues the key again).
// ctx is the promoter's; the calls to coderd share one promoterMaxCheck.
func (p *promoter) checkBuild(ctx context.Context, t target, key records.Key, rec *records.Record) bool {
	s := p.s
	b := rec.Spec.Build
	log := s.log.WithValues("namespace", rec.Namespace, "template", rec.Spec.Name, "templateVersion", b.VersionID)
	versionID, err1 := uuid.Parse(b.VersionID)
	templateID, err2 := uuid.Parse(rec.Spec.CoderID)
	if err := errors.Join(err1, err2); err != nil {
		log.Error(err, "template build promoter: malformed record; dropping its build")
		return s.endBuild(ctx, rec, nil, log)
	}
	cctx, cancel := context.WithTimeout(ctx, promoterMaxCheck)
	defer cancel()
	polled := time.Now()
	v, done, err := templatesource.Poll(cctx, t.Client, versionID)
	if ctx.Err() != nil {
		return false
	}
	var failed *templatesource.BuildFailedError
	if err != nil && !errors.As(err, &failed) && !coderapi.IsNotFound(err) {
		since := p.pollFailed(backendOfKey(key), polled)
		if s.pastTimeout(b) {
			return s.timeOut(ctx, t, rec, versionID, fmt.Sprintf("the import did not finish within %s (%s): %s",
				s.opts.BuildWait.Timeout, timeoutSetting, pollFailure(since, err)), log)
		}
		log.V(1).Info("template build promoter: poll failed; retrying", "error", err.Error())
		return false
	}
	p.pollAnswered(backendOfKey(key))
	switch {
	case failed != nil:
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
	case err != nil:
		log.Info("template build promoter: the version is gone from Coder; dropping the build")
		return s.endBuild(ctx, rec, nil, log)
	case !done:
		if s.pastTimeout(b) {
			return s.timeOut(ctx, t, rec, versionID, fmt.Sprintf("the import did not finish within %s (%s; job %s)",
				s.opts.BuildWait.Timeout, timeoutSetting, v.Job.Status), log)
		}
		return false
	}
	// Built: make it active, unless it is already (a new template's first
	// version, or a promotion whose record write was lost).
	tpl, err := t.Client.Template(cctx, templateID)
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
		// have replaced it since this check read it.
		if cur, err := s.records.get(ctx, key); err != nil || cur == nil || cur.Spec.Build == nil || cur.Spec.Build.VersionID != b.VersionID {
			return false
		}
		// codersdk's UpdateActiveTemplateVersion reports success when the
		// request never reached coderd, so read the template back.
		if err := t.Client.UpdateActiveTemplateVersion(cctx, templateID, codersdk.UpdateActiveTemplateVersion{ID: versionID}); err != nil {
			log.Info("template build promoter: promote failed; retrying", "error", err.Error())
			return false
		}
		if tpl, err = t.Client.Template(cctx, templateID); err != nil || tpl.ActiveVersionID != versionID {
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

// pastTimeout reports whether build b has run longer than
// templateBuildWait.timeout (none when it is not positive).
func (s *TemplateStorage) pastTimeout(b *coderv1alpha1.TemplateBuildRecord) bool {
	timeout := s.opts.BuildWait.Timeout
	return timeout > 0 && time.Since(b.StartedAt.Time) > timeout
}

// pollFailure says why coderd's polls have got no usable answer since
// (in UTC), err being the last one's.
func pollFailure(since time.Time, err error) string {
	at := since.UTC().Truncate(time.Second).Format(time.RFC3339)
	if templatesource.IsTransient(err) {
		return fmt.Sprintf("coderd could not be reached since %s (last error: %s)", at, shortError(err))
	}
	return fmt.Sprintf("coderd has refused to show the version since %s (last error: %s)", at, shortError(err))
}

// shortError is err without the request URL when no HTTP answer came.
func shortError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// timeoutSetting names templateBuildWait.timeout in messages.
const timeoutSetting = "aggregatedAPIServer.templateBuildWait.timeout"

// timeOut ends a build that ran past templateBuildWait.timeout: it asks
// coderd to cancel the import (best effort: coderd may not answer) and
// records the build failed with the message why, followed by whether the
// cancel reached coderd.
func (s *TemplateStorage) timeOut(ctx context.Context, t target, rec *records.Record, versionID uuid.UUID, why string, log logr.Logger) bool {
	b := rec.Spec.Build
	canceled := "coder-k8s canceled it"
	if err := s.cancelImport(ctx, t, versionID); err != nil {
		canceled = "coder-k8s could not cancel it in Coder: " + shortError(err)
	}
	nb := b.DeepCopy()
	nb.Failed = true
	nb.Error = why + "; " + canceled
	if s.endBuild(ctx, rec, nb, log) {
		metrics.ObserveBuildWait(metrics.BuildTimeout, time.Since(b.StartedAt.Time))
		log.Info("template build timed out; recorded it failed", "error", nb.Error)
	}
	return true
}

// endBuild claims a build's outcome: it writes nb (nil clears the build)
// to the record read as rec, with rec's resourceVersion. It reports
// whether this write won; a conflict means another replica or a request
// changed the record first, and the next check looks again.
func (s *TemplateStorage) endBuild(ctx context.Context, rec *records.Record, nb *coderv1alpha1.TemplateBuildRecord, log logr.Logger) bool {
	ctx, cancel := context.WithTimeout(ctx, promoterMaxCheck)
	defer cancel()
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

// refreshBuild reads the template of k from Coder again and puts it in
// the watch cache. A template that cannot be read now is left to the
// next poll.
func (s *TemplateStorage) refreshBuild(ctx context.Context, t target, k records.Key) {
	ctx, cancel := context.WithTimeout(ctx, promoterMaxCheck)
	defer cancel()
	if err := s.refreshTemplate(ctx, t, k.CoderID); err != nil {
		s.log.V(1).Info("template build promoter: re-read the template after its build ended; the next poll will", "namespace", k.Namespace, "template", k.CoderID, "error", err.Error())
	}
}

func (s *TemplateStorage) refreshTemplate(ctx context.Context, t target, coderID string) error {
	id, err := uuid.Parse(coderID)
	if err != nil {
		return fmt.Errorf("template ID %q: %w", coderID, err)
	}
	// The record before the template: see convert.
	rec, err := s.templateRecord(ctx, t, id)
	if err != nil {
		return err
	}
	tpl, err := t.Client.Template(ctx, id)
	if err != nil {
		return fmt.Errorf("get template %s: %w", id, err)
	}
	obj, err := s.convert(ctx, t, &tpl, rec)
	if err != nil {
		return err
	}
	_, err = s.publishRead(ctx, t, obj)
	return err
}
