package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Accessors of the status fields every coder.com kind has, so that the
// controllers' shared code reaches them through an interface rather than
// through each kind's status type.

// GetConditions returns the object's status conditions.
func (c *CoderControlPlane) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the object's status conditions.
func (c *CoderControlPlane) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

// GetPhase returns the object's status phase.
func (c *CoderControlPlane) GetPhase() Phase { return c.Status.Phase }

// SetPhase sets the object's status phase.
func (c *CoderControlPlane) SetPhase(p Phase) { c.Status.Phase = p }

// SetObservedGeneration records the generation the status describes.
func (c *CoderControlPlane) SetObservedGeneration(g int64) { c.Status.ObservedGeneration = g }

// GetConditions returns the object's status conditions.
func (p *CoderProvisioner) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions replaces the object's status conditions.
func (p *CoderProvisioner) SetConditions(conds []metav1.Condition) { p.Status.Conditions = conds }

// GetPhase returns the object's status phase.
func (p *CoderProvisioner) GetPhase() Phase { return p.Status.Phase }

// SetPhase sets the object's status phase.
func (p *CoderProvisioner) SetPhase(ph Phase) { p.Status.Phase = ph }

// SetObservedGeneration records the generation the status describes.
func (p *CoderProvisioner) SetObservedGeneration(g int64) { p.Status.ObservedGeneration = g }

// SetReplicas records the replicas of the daemons' Deployment.
func (p *CoderProvisioner) SetReplicas(replicas, ready int32) {
	p.Status.Replicas, p.Status.ReadyReplicas = replicas, ready
}

// GetConditions returns the object's status conditions.
func (w *CoderWorkspaceProxy) GetConditions() []metav1.Condition { return w.Status.Conditions }

// SetConditions replaces the object's status conditions.
func (w *CoderWorkspaceProxy) SetConditions(conds []metav1.Condition) { w.Status.Conditions = conds }

// GetPhase returns the object's status phase.
func (w *CoderWorkspaceProxy) GetPhase() Phase { return w.Status.Phase }

// SetPhase sets the object's status phase.
func (w *CoderWorkspaceProxy) SetPhase(ph Phase) { w.Status.Phase = ph }

// SetObservedGeneration records the generation the status describes.
func (w *CoderWorkspaceProxy) SetObservedGeneration(g int64) { w.Status.ObservedGeneration = g }

// SetReplicas records the replicas of the proxy's Deployment.
func (w *CoderWorkspaceProxy) SetReplicas(replicas, ready int32) {
	w.Status.Replicas, w.Status.ReadyReplicas = replicas, ready
}
