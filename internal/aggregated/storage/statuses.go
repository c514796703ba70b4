package storage

import (
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/coderstatus"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
	"github.com/coder/coder-k8s/internal/truncate"
)

// The Kubernetes statuses the storage answers with, naming the resource
// and, for coderd's errors, the control plane behind them.

// notFound is a NotFound status whose message says why.
func (r *genericStore) notFound(name, why string) error {
	err := apierrors.NewNotFound(r.gr, name)
	err.ErrStatus.Message = fmt.Sprintf("%s: %s", err.ErrStatus.Message, why)
	return err
}

// badName is the NotFound a malformed name gets on reads: no object can
// have that name.
func (r *genericStore) badName(name string, err error) error {
	return r.notFound(name, err.Error())
}

// coderErr turns an error from t's coderd into a Kubernetes status that
// names the control plane (or the static backend) in its hints.
func (r *genericStore) coderErr(t target, err error, name string) error {
	if t.caller != nil && t.operator != nil && coderapi.StatusCode(err) == http.StatusForbidden {
		if _, premium := coderapi.FeatureUnavailable(err); !premium {
			// coderd refused the caller, not coder-k8s: say whom, as a
			// dry run's refusal does, rather than blame operator access.
			return apierrors.NewForbidden(r.gr, name, &identity.Refused{Reason: fmt.Sprintf("coderd of %s refused Coder user %q: %s",
				t.describe(), t.caller.Username, truncate.String(coderapi.Message(err), 1024))})
		}
	}
	return coderstatus.Error(err, r.statusTarget(t, name))
}

// statusTarget describes the object and t's coderd for coderstatus.
func (r *genericStore) statusTarget(t target, name string) coderstatus.Target {
	tgt := coderstatus.Target{Resource: r.gr, Kind: r.kind, Name: name, Fields: r.fields, StaticBackend: t.ControlPlane == ""}
	if t.URL != nil {
		tgt.CoderURL = t.URL.String()
	}
	if t.ControlPlane != "" {
		tgt.ControlPlane = t.Namespace + "/" + t.ControlPlane
	}
	return tgt
}

// createErr is coderErr for a create: a 409 means the object exists.
func (r *genericStore) createErr(t target, err error, name string) error {
	se := r.coderErr(t, err, name)
	if coderapi.StatusCode(err) == http.StatusConflict {
		return apierrors.NewAlreadyExists(r.gr, name)
	}
	return se
}

// conflict is the 409 a stale resourceVersion gets.
func (r *genericStore) conflict(name string) error {
	return apierrors.NewConflict(r.gr, name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
}

// invalid is the 422 a request whose object breaks the rules gets.
func (r *genericStore) invalid(name string, errs field.ErrorList) error {
	return apierrors.NewInvalid(aggv1.SchemeGroupVersion.WithKind(r.kind).GroupKind(), name, errs)
}

// errMessage is the message of an error that may be a Kubernetes status.
func errMessage(err error) string {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Message
	}
	return err.Error()
}
