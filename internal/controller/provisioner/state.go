package provisioner

import (
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

// state is one reconcile's view of a CoderProvisioner: the shared
// condition and event handling over the status being built.
type state struct {
	*dependent.State
	obj    *coderv1alpha1.CoderProvisioner
	status coderv1alpha1.CoderProvisionerStatus
}

func newState(obj *coderv1alpha1.CoderProvisioner) *state {
	st := &state{obj: obj, status: *obj.Status.DeepCopy()}
	s := &st.status
	st.State = dependent.NewState(obj, &obj.Status, s, dependent.Status{
		ObservedGeneration: &s.ObservedGeneration, Phase: &s.Phase,
		Replicas: &s.Replicas, ReadyReplicas: &s.ReadyReplicas, Conditions: &s.Conditions,
	})
	return st
}
