package mcpserver

// One file (over 500 lines) for the control plane tools: their input and
// output types are the tools' JSON schemas, so they stay next to the
// handlers that fill them.

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/coder/coder-k8s/internal/truncate"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// maxMessageChars caps condition and pod messages so that one noisy
// object does not flood a row.
const maxMessageChars = 300

// ControlPlaneInput names one CoderControlPlane.
type ControlPlaneInput struct {
	Namespace string `json:"namespace" jsonschema:"Kubernetes namespace of the CoderControlPlane"`
	Name      string `json:"name" jsonschema:"CoderControlPlane name (list_control_planes shows them)"`
}

// ControlPlaneRow is one control plane in a list.
type ControlPlaneRow struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Phase       string `json:"phase,omitempty" jsonschema:"Pending, Provisioning, Ready, Degraded, Failed or Unsupported; empty before the first reconcile"`
	URL         string `json:"url,omitempty" jsonschema:"where the operator reaches coderd"`
	AccessReady bool   `json:"accessReady" jsonschema:"the operator holds a working Coder token (condition OperatorAccessReady), so templates and workspaces of this control plane are visible"`
	Adopted     bool   `json:"adopted,omitempty" jsonschema:"an existing coderd adopted with spec.externalURL: the operator deploys no Deployment or Service for it"`
	Age         string `json:"age" jsonschema:"time since creation, as kubectl shows it"`
}

// ControlPlaneList is a page of control planes.
type ControlPlaneList struct {
	Items    []ControlPlaneRow `json:"items"`
	Continue string            `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

// StatusCondition is one condition of an object's status.
type StatusCondition struct {
	Type           string `json:"type"`
	Status         string `json:"status" jsonschema:"True, False or Unknown"`
	Reason         string `json:"reason,omitempty"`
	Message        string `json:"message,omitempty"`
	LastTransition string `json:"lastTransition,omitempty" jsonschema:"RFC 3339 time of the last status change"`
}

// OperatorAccessInfo is the operator's access to a coderd. The token itself
// is never shown, only the name of the Secret that holds it.
type OperatorAccessInfo struct {
	Ready           bool   `json:"ready" jsonschema:"condition OperatorAccessReady is True"`
	Reason          string `json:"reason,omitempty" jsonschema:"reason of the OperatorAccessReady condition"`
	Message         string `json:"message,omitempty" jsonschema:"message of the OperatorAccessReady condition: what is wrong when not ready"`
	Disabled        bool   `json:"disabled,omitempty" jsonschema:"spec.operatorAccess.disabled: the control plane is deliberately invisible to the aggregated API and MCP"`
	User            string `json:"user,omitempty" jsonschema:"the Coder user the operator acts as"`
	TokenSecretName string `json:"tokenSecretName,omitempty" jsonschema:"name of the Secret (in the control plane's namespace) holding the operator's Coder token; its contents are never shown"`
}

// LicenseInfo summarizes coderd's entitlements.
type LicenseInfo struct {
	HasLicense bool     `json:"hasLicense"`
	Trial      bool     `json:"trial,omitempty"`
	Features   []string `json:"features,omitempty" jsonschema:"entitled and enabled features"`
}

// ControlPlaneDetail is one control plane's status.
type ControlPlaneDetail struct {
	Namespace          string             `json:"namespace"`
	Name               string             `json:"name"`
	Adopted            bool               `json:"adopted" jsonschema:"an existing coderd adopted with spec.externalURL: the operator deploys no Deployment or Service for it"`
	ExternalURL        string             `json:"externalURL,omitempty" jsonschema:"spec.externalURL of an adopted coderd"`
	AccessURL          string             `json:"accessURL,omitempty" jsonschema:"spec.accessURL: the URL users and workspaces reach coderd at"`
	Image              string             `json:"image,omitempty" jsonschema:"spec.image (empty: the operator's default Coder release)"`
	Phase              string             `json:"phase,omitempty" jsonschema:"Pending, Provisioning, Ready, Degraded, Failed or Unsupported"`
	URL                string             `json:"url,omitempty" jsonschema:"where the operator reaches coderd"`
	CoderVersion       string             `json:"coderVersion,omitempty" jsonschema:"the version coderd reports"`
	Generation         int64              `json:"generation" jsonschema:"metadata.generation: changes with every spec change"`
	ObservedGeneration int64              `json:"observedGeneration" jsonschema:"the generation the status describes"`
	StatusCurrent      bool               `json:"statusCurrent" jsonschema:"observedGeneration has caught up with generation; false means the operator has not yet acted on the latest spec change"`
	DesiredReplicas    *int32             `json:"desiredReplicas,omitempty" jsonschema:"spec.replicas of a deployed coderd"`
	Replicas           int32              `json:"replicas" jsonschema:"coderd pods of the Deployment"`
	ReadyReplicas      int32              `json:"readyReplicas" jsonschema:"ready coderd pods"`
	Conditions         []StatusCondition  `json:"conditions" jsonschema:"every status condition: Available, OperatorAccessReady, Reconciled, Exposed, LicenseApplied"`
	OperatorAccess     OperatorAccessInfo `json:"operatorAccess"`
	License            *LicenseInfo       `json:"license,omitempty"`
	Age                string             `json:"age"`
}

// ControlPlanePodsInput pages through a control plane's pods.
type ControlPlanePodsInput struct {
	Namespace string `json:"namespace" jsonschema:"Kubernetes namespace of the CoderControlPlane"`
	Name      string `json:"name" jsonschema:"CoderControlPlane name"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 100)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, for the next rows"`
}

// PodRow is one pod in a list.
type PodRow struct {
	Name     string `json:"name"`
	Phase    string `json:"phase" jsonschema:"Pending, Running, Succeeded, Failed or Unknown"`
	Ready    string `json:"ready" jsonschema:"ready containers / containers"`
	Restarts int32  `json:"restarts" jsonschema:"container restarts in all"`
	Node     string `json:"node,omitempty"`
	Age      string `json:"age"`
	Reason   string `json:"reason,omitempty" jsonschema:"why the pod is not ready (for example CrashLoopBackOff, ImagePullBackOff, Unschedulable), when it is not"`
}

// ControlPlanePods is a page of a control plane's coderd pods.
type ControlPlanePods struct {
	Namespace  string   `json:"namespace"`
	Deployment string   `json:"deployment,omitempty" jsonschema:"the Deployment whose selector picked the pods"`
	Selector   string   `json:"selector,omitempty" jsonschema:"the label selector, for kubectl get pods -l"`
	Adopted    bool     `json:"adopted,omitempty" jsonschema:"the control plane adopts an existing coderd: the operator runs no pods for it"`
	Message    string   `json:"message,omitempty"`
	Total      int      `json:"total" jsonschema:"pods the selector matches, on all pages"`
	Items      []PodRow `json:"items"`
	Continue   string   `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

// ControlPlaneRollout is the rollout state of a control plane's Deployment.
type ControlPlaneRollout struct {
	Namespace           string            `json:"namespace"`
	Deployment          string            `json:"deployment,omitempty"`
	Adopted             bool              `json:"adopted,omitempty" jsonschema:"the control plane adopts an existing coderd: the operator deploys nothing, so there is no rollout"`
	Complete            bool              `json:"complete" jsonschema:"the rollout is done, as kubectl rollout status judges it"`
	Status              string            `json:"status" jsonschema:"what kubectl rollout status would print"`
	Paused              bool              `json:"paused,omitempty" jsonschema:"the Deployment is paused (spec.paused): it makes no progress until resumed"`
	DesiredReplicas     int32             `json:"desiredReplicas" jsonschema:"spec.replicas"`
	Replicas            int32             `json:"replicas" jsonschema:"pods of all revisions"`
	UpdatedReplicas     int32             `json:"updatedReplicas" jsonschema:"pods of the latest revision"`
	ReadyReplicas       int32             `json:"readyReplicas"`
	AvailableReplicas   int32             `json:"availableReplicas"`
	UnavailableReplicas int32             `json:"unavailableReplicas"`
	Generation          int64             `json:"generation"`
	ObservedGeneration  int64             `json:"observedGeneration" jsonschema:"the generation the Deployment controller has acted on"`
	Conditions          []StatusCondition `json:"conditions"`
}

// ServicePortInfo is one port of a Service.
type ServicePortInfo struct {
	Name       string `json:"name,omitempty"`
	Port       int32  `json:"port"`
	TargetPort string `json:"targetPort,omitempty" jsonschema:"container port number or name"`
	NodePort   int32  `json:"nodePort,omitempty"`
	Protocol   string `json:"protocol"`
}

// ControlPlaneService is a control plane's Service.
type ControlPlaneService struct {
	Namespace         string            `json:"namespace"`
	Service           string            `json:"service,omitempty"`
	Adopted           bool              `json:"adopted,omitempty" jsonschema:"the control plane adopts an existing coderd: the operator creates no Service for it"`
	Message           string            `json:"message,omitempty"`
	Type              string            `json:"type,omitempty" jsonschema:"ClusterIP, NodePort or LoadBalancer"`
	ClusterIP         string            `json:"clusterIP,omitempty"`
	Ports             []ServicePortInfo `json:"ports,omitempty"`
	InClusterURL      string            `json:"inClusterURL,omitempty" jsonschema:"the Service's DNS name and first port, as pods in the cluster reach it"`
	ExternalAddresses []string          `json:"externalAddresses,omitempty" jsonschema:"load balancer IPs or host names and spec.externalIPs"`
	Pending           bool              `json:"pending,omitempty" jsonschema:"a LoadBalancer Service that has no external address yet"`
}

func (s *Server) controlPlaneTools() []tool {
	return []tool{
		define(s, "list_control_planes", toolMeta{
			Title:       "List Coder control planes",
			Description: "Lists CoderControlPlane objects (coderd deployments the operator runs or adopts) with phase, URL and whether the operator's access works, a page at a time. Leave namespace empty for every namespace. Use get_control_plane for one control plane's conditions.",
			ReadOnly:    true, Idempotent: true,
		}, listControlPlanes),
		define(s, "get_control_plane", toolMeta{
			Title:       "Get a Coder control plane's status",
			Description: "Shows one CoderControlPlane: phase, URL, Coder version, whether the status reflects the latest spec (observedGeneration), every condition with reason and message, and the operator's access (ready, Coder user, name of the token Secret). Start here when a control plane is not Ready; then look at its pods, rollout and Service.",
			ReadOnly:    true, Idempotent: true,
		}, getControlPlane),
		define(s, "list_control_plane_pods", toolMeta{
			Title:       "List a control plane's coderd pods",
			Description: "Lists the coderd pods of a CoderControlPlane (those its Deployment selects), a page at a time: phase, ready containers, restarts, node, age, and the reason a pod is not ready (CrashLoopBackOff, ImagePullBackOff, Unschedulable, ...).",
			ReadOnly:    true, Idempotent: true,
		}, listControlPlanePods),
		define(s, "get_control_plane_rollout", toolMeta{
			Title:       "Get a control plane's rollout status",
			Description: "Shows the rollout of a CoderControlPlane's coderd Deployment: desired, updated, ready and available replicas, observedGeneration, conditions, and whether the rollout is complete as `kubectl rollout status` would judge it (including an exceeded progress deadline).",
			ReadOnly:    true, Idempotent: true,
		}, getControlPlaneRollout),
		define(s, "get_control_plane_service", toolMeta{
			Title:       "Get a control plane's Service",
			Description: "Shows the Service in front of a CoderControlPlane's coderd: type, cluster IP, ports, in-cluster URL and external addresses (load balancer IPs or host names), or that a LoadBalancer is still pending.",
			ReadOnly:    true, Idempotent: true,
		}, getControlPlaneService),
	}
}

func listControlPlanes(ctx context.Context, c *call, in ListInput) (ControlPlaneList, error) {
	var list coderv1alpha1.CoderControlPlaneList
	if err := c.kube.Cached.List(ctx, &list, client.InNamespace(in.Namespace)); err != nil {
		return ControlPlaneList{}, fmt.Errorf("list codercontrolplanes: %w", err)
	}
	if err := sortListed(ctx, c, in.Namespace, list.Items, errNoNamespace); err != nil {
		return ControlPlaneList{}, err
	}
	items, next, err := page(list.Items, in.Limit, in.Continue)
	if err != nil {
		return ControlPlaneList{}, err
	}
	out := ControlPlaneList{Items: make([]ControlPlaneRow, len(items)), Continue: next}
	for i := range items {
		cp := &items[i]
		out.Items[i] = ControlPlaneRow{Namespace: cp.Namespace, Name: cp.Name, Phase: string(cp.Status.Phase),
			URL: redactURL(cp.Status.URL), AccessReady: conditionTrue(cp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady),
			Adopted: adopted(cp), Age: objectAge(cp.CreationTimestamp)}
	}
	return out, nil
}

func getControlPlane(ctx context.Context, c *call, in ControlPlaneInput) (ControlPlaneDetail, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return ControlPlaneDetail{}, err
	}
	cp, err := c.controlPlane(ctx, in.Namespace, in.Name)
	if err != nil {
		return ControlPlaneDetail{}, err
	}
	st := &cp.Status
	d := ControlPlaneDetail{
		Namespace: cp.Namespace, Name: cp.Name, Adopted: adopted(cp), ExternalURL: redactURL(cp.Spec.ExternalURL),
		AccessURL: redactURL(cp.Spec.AccessURL), Image: cp.Spec.Image, Phase: string(st.Phase), URL: redactURL(st.URL),
		CoderVersion: st.CoderVersion, Generation: cp.Generation, ObservedGeneration: st.ObservedGeneration,
		StatusCurrent: st.ObservedGeneration >= cp.Generation, Replicas: st.Replicas, ReadyReplicas: st.ReadyReplicas,
		Conditions: statusConditions(st.Conditions), Age: objectAge(cp.CreationTimestamp),
		OperatorAccess: OperatorAccessInfo{Disabled: cp.Spec.OperatorAccess.Disabled, User: st.OperatorUser},
	}
	if !d.Adopted {
		d.DesiredReplicas = cp.Spec.Replicas
	}
	for _, cond := range st.Conditions {
		if cond.Type == coderv1alpha1.ConditionOperatorAccessReady {
			d.OperatorAccess.Ready = cond.Status == metav1.ConditionTrue
			d.OperatorAccess.Reason, d.OperatorAccess.Message = cond.Reason, truncate.String(cond.Message, maxMessageChars)
		}
	}
	// The Secret's name only: its data is never read.
	if ref := st.OperatorTokenSecretRef; ref != nil {
		d.OperatorAccess.TokenSecretName = ref.Name
	}
	if e := st.Entitlements; e != nil {
		d.License = &LicenseInfo{HasLicense: e.HasLicense, Trial: e.Trial, Features: e.Features}
	}
	return d, nil
}

func listControlPlanePods(ctx context.Context, c *call, in ControlPlanePodsInput) (ControlPlanePods, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return ControlPlanePods{}, err
	}
	cp, err := c.controlPlane(ctx, in.Namespace, in.Name)
	if err != nil {
		return ControlPlanePods{}, err
	}
	out := ControlPlanePods{Namespace: cp.Namespace, Items: []PodRow{}}
	if adopted(cp) {
		out.Adopted, out.Message = true, adoptedMessage(cp, "runs no coderd pods")
		return out, nil
	}
	dep, err := c.controlPlaneDeployment(ctx, cp)
	if err != nil {
		return ControlPlanePods{}, err
	}
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil {
		return ControlPlanePods{}, fmt.Errorf("deployment %s/%s has an invalid selector: %w", dep.Namespace, dep.Name, err)
	}
	out.Deployment, out.Selector = dep.Name, sel.String()
	// Pods are read directly: no cluster-wide pod informer for a tool.
	var pods corev1.PodList
	if err := c.kube.Direct.List(ctx, &pods, client.InNamespace(cp.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return ControlPlanePods{}, fmt.Errorf("list pods of deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	items, next, err := page(pods.Items, in.Limit, in.Continue)
	if err != nil {
		return ControlPlanePods{}, err
	}
	out.Total, out.Continue = len(pods.Items), next
	for i := range items {
		out.Items = append(out.Items, podRow(&items[i]))
	}
	if out.Total == 0 {
		out.Message = fmt.Sprintf("no pods match %s: see get_control_plane_rollout for the Deployment's conditions (for example a quota or admission failure)", out.Selector)
	}
	return out, nil
}

func getControlPlaneRollout(ctx context.Context, c *call, in ControlPlaneInput) (ControlPlaneRollout, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return ControlPlaneRollout{}, err
	}
	cp, err := c.controlPlane(ctx, in.Namespace, in.Name)
	if err != nil {
		return ControlPlaneRollout{}, err
	}
	if adopted(cp) {
		return ControlPlaneRollout{Namespace: cp.Namespace, Adopted: true, Status: adoptedMessage(cp, "deploys nothing, so there is no rollout"),
			Conditions: []StatusCondition{}}, nil
	}
	dep, err := c.controlPlaneDeployment(ctx, cp)
	if err != nil {
		return ControlPlaneRollout{}, err
	}
	st := &dep.Status
	r := ControlPlaneRollout{
		Namespace: dep.Namespace, Deployment: dep.Name, Paused: dep.Spec.Paused, DesiredReplicas: desiredReplicas(dep),
		Replicas: st.Replicas, UpdatedReplicas: st.UpdatedReplicas, ReadyReplicas: st.ReadyReplicas,
		AvailableReplicas: st.AvailableReplicas, UnavailableReplicas: st.UnavailableReplicas,
		Generation: dep.Generation, ObservedGeneration: st.ObservedGeneration,
		Conditions: make([]StatusCondition, 0, len(st.Conditions)),
	}
	for _, cond := range st.Conditions {
		r.Conditions = append(r.Conditions, StatusCondition{Type: string(cond.Type), Status: string(cond.Status),
			Reason: cond.Reason, Message: truncate.String(cond.Message, maxMessageChars), LastTransition: rfc3339(cond.LastTransitionTime)})
	}
	r.Status, r.Complete = rolloutStatus(dep)
	if r.Paused && !r.Complete {
		r.Status += " (the Deployment is paused: it makes no progress until resumed)"
	}
	return r, nil
}

// rolloutStatus judges a Deployment's rollout as `kubectl rollout status`
// does (k8s.io/kubectl/pkg/polymorphichelpers.DeploymentStatusViewer).
func rolloutStatus(d *appsv1.Deployment) (string, bool) {
	st := &d.Status
	if d.Generation > st.ObservedGeneration {
		return "Waiting for deployment spec update to be observed...", false
	}
	for _, cond := range st.Conditions {
		// deploymentutil.TimedOutReason
		if cond.Type == appsv1.DeploymentProgressing && cond.Reason == "ProgressDeadlineExceeded" {
			return fmt.Sprintf("deployment %q exceeded its progress deadline", d.Name), false
		}
	}
	switch {
	case d.Spec.Replicas != nil && st.UpdatedReplicas < *d.Spec.Replicas:
		return fmt.Sprintf("Waiting for deployment %q rollout to finish: %d out of %d new replicas have been updated...", d.Name, st.UpdatedReplicas, *d.Spec.Replicas), false
	case st.Replicas > st.UpdatedReplicas:
		return fmt.Sprintf("Waiting for deployment %q rollout to finish: %d old replicas are pending termination...", d.Name, st.Replicas-st.UpdatedReplicas), false
	case st.AvailableReplicas < st.UpdatedReplicas:
		return fmt.Sprintf("Waiting for deployment %q rollout to finish: %d of %d updated replicas are available...", d.Name, st.AvailableReplicas, st.UpdatedReplicas), false
	}
	return fmt.Sprintf("deployment %q successfully rolled out", d.Name), true
}

func getControlPlaneService(ctx context.Context, c *call, in ControlPlaneInput) (ControlPlaneService, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return ControlPlaneService{}, err
	}
	cp, err := c.controlPlane(ctx, in.Namespace, in.Name)
	if err != nil {
		return ControlPlaneService{}, err
	}
	if adopted(cp) {
		return ControlPlaneService{Namespace: cp.Namespace, Adopted: true, Message: adoptedMessage(cp, "creates no Service")}, nil
	}
	var svc corev1.Service
	if err := c.kube.Cached.Get(ctx, types.NamespacedName{Namespace: cp.Namespace, Name: cp.Name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return ControlPlaneService{}, notCreatedYet(cp, "Service")
		}
		return ControlPlaneService{}, fmt.Errorf("get service %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	out := ControlPlaneService{Namespace: svc.Namespace, Service: svc.Name, Type: string(svc.Spec.Type), ClusterIP: svc.Spec.ClusterIP}
	for _, p := range svc.Spec.Ports {
		sp := ServicePortInfo{Name: p.Name, Port: p.Port, NodePort: p.NodePort, Protocol: string(p.Protocol)}
		if p.TargetPort.IntValue() != 0 || p.TargetPort.StrVal != "" {
			sp.TargetPort = p.TargetPort.String()
		}
		out.Ports = append(out.Ports, sp)
	}
	if len(svc.Spec.Ports) > 0 {
		scheme := "http"
		if svc.Spec.Ports[0].Port == 443 || svc.Spec.Ports[0].Name == "https" {
			scheme = "https"
		}
		out.InClusterURL = fmt.Sprintf("%s://%s.%s.svc:%d", scheme, svc.Name, svc.Namespace, svc.Spec.Ports[0].Port)
	}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP != "" {
			out.ExternalAddresses = append(out.ExternalAddresses, ing.IP)
		}
		if ing.Hostname != "" {
			out.ExternalAddresses = append(out.ExternalAddresses, ing.Hostname)
		}
	}
	out.ExternalAddresses = append(out.ExternalAddresses, svc.Spec.ExternalIPs...)
	out.Pending = svc.Spec.Type == corev1.ServiceTypeLoadBalancer && len(svc.Status.LoadBalancer.Ingress) == 0
	if out.Pending {
		out.Message = "the LoadBalancer has no external address yet: the cluster's load balancer controller has not provisioned one (check its events with the Service)"
	}
	return out, nil
}

// controlPlane reads a control plane, with an error that says what to do
// when it does not exist.
func (c *call) controlPlane(ctx context.Context, namespace, name string) (*coderv1alpha1.CoderControlPlane, error) {
	var cp coderv1alpha1.CoderControlPlane
	if err := c.kube.Cached.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &cp); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get codercontrolplane %s/%s: %w", namespace, name, err)
		}
		if c.namespaceMissing(ctx, namespace) {
			return nil, errNoNamespace(namespace)
		}
		return nil, fmt.Errorf("there is no CoderControlPlane %q in namespace %q; list_control_planes (with namespace %q, or none for every namespace) shows the control planes there are", name, namespace, namespace)
	}
	return &cp, nil
}

// controlPlaneDeployment reads the coderd Deployment of a deployed control
// plane, which shares its name and namespace (internal/controller/controlplane).
func (c *call) controlPlaneDeployment(ctx context.Context, cp *coderv1alpha1.CoderControlPlane) (*appsv1.Deployment, error) {
	var dep appsv1.Deployment
	if err := c.kube.Cached.Get(ctx, types.NamespacedName{Namespace: cp.Namespace, Name: cp.Name}, &dep); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, notCreatedYet(cp, "Deployment")
		}
		return nil, fmt.Errorf("get deployment %s/%s: %w", cp.Namespace, cp.Name, err)
	}
	return &dep, nil
}

// namespaceMissing reports whether namespace surely does not exist. Other
// failures (for example the caller may not read namespaces) say nothing.
func (c *call) namespaceMissing(ctx context.Context, namespace string) bool {
	err := c.kube.Direct.Get(ctx, types.NamespacedName{Name: namespace}, &corev1.Namespace{})
	return apierrors.IsNotFound(err)
}

func errNoNamespace(namespace string) error {
	return fmt.Errorf("namespace %q does not exist; call list_control_planes without a namespace to see every control plane and its namespace", namespace)
}

// notCreatedYet explains a missing child of a deployed control plane.
func notCreatedYet(cp *coderv1alpha1.CoderControlPlane, kind string) error {
	phase := string(cp.Status.Phase)
	if phase == "" {
		phase = "not reconciled yet"
	}
	return fmt.Errorf("control plane %s/%s has no %s %q (phase: %s): the operator creates it when it reconciles the control plane; get_control_plane shows its conditions (for example Reconciled=False with the reason)",
		cp.Namespace, cp.Name, kind, cp.Name, phase)
}

func adopted(cp *coderv1alpha1.CoderControlPlane) bool { return cp.Spec.ExternalURL != "" }

func adoptedMessage(cp *coderv1alpha1.CoderControlPlane, what string) string {
	return fmt.Sprintf("control plane %s/%s adopts an existing coderd at %s (spec.externalURL): the operator %s for it. Use get_control_plane for its status and health to check that coderd answers.",
		cp.Namespace, cp.Name, redactURL(cp.Spec.ExternalURL), what)
}

func desiredReplicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

// podRow is a compact view of p, like a row of kubectl get pods.
func podRow(p *corev1.Pod) PodRow {
	ready, restarts := 0, int32(0)
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Ready {
			ready++
		}
		restarts += cs.RestartCount
	}
	r := PodRow{Name: p.Name, Phase: string(p.Status.Phase), Ready: strconv.Itoa(ready) + "/" + strconv.Itoa(len(p.Spec.Containers)),
		Restarts: restarts, Node: p.Spec.NodeName, Age: objectAge(p.CreationTimestamp)}
	if p.DeletionTimestamp != nil || !podConditionTrue(p, corev1.PodReady) {
		r.Reason = podNotReadyReason(p)
	}
	return r
}

func podConditionTrue(p *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podNotReadyReason says, as specifically as the pod's status allows, why
// it is not ready.
func podNotReadyReason(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "Terminating"
	}
	withMessage := func(reason, msg string) string {
		if msg == "" {
			return reason
		}
		return truncate.String(reason+": "+msg, maxMessageChars)
	}
	for _, cs := range p.Status.InitContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" {
			return withMessage("Init:"+w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return withMessage("Init:"+nonEmpty(t.Reason, "Error"), t.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return withMessage(w.Reason, w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			return withMessage(nonEmpty(t.Reason, "Terminated"), t.Message)
		}
	}
	if p.Status.Reason != "" {
		return withMessage(p.Status.Reason, p.Status.Message)
	}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		for _, c := range p.Status.Conditions {
			if c.Type == t && c.Status != corev1.ConditionTrue {
				return withMessage(nonEmpty(c.Reason, string(t)+"="+string(c.Status)), c.Message)
			}
		}
	}
	if p.Spec.NodeName == "" {
		return "not scheduled yet"
	}
	return "no Ready condition yet (the kubelet has not reported the pod's status)"
}

func nonEmpty(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}

func conditionTrue(conds []metav1.Condition, t string) bool {
	for _, c := range conds {
		if c.Type == t {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

func statusConditions(conds []metav1.Condition) []StatusCondition {
	out := make([]StatusCondition, 0, len(conds))
	for _, c := range conds {
		out = append(out, StatusCondition{Type: c.Type, Status: string(c.Status), Reason: c.Reason,
			Message: truncate.String(c.Message, maxMessageChars), LastTransition: rfc3339(c.LastTransitionTime)})
	}
	return out
}

// objectAge is the time since t as kubectl prints it ("5m", "3d").
func objectAge(t metav1.Time) string {
	if t.IsZero() {
		return ""
	}
	return duration.HumanDuration(time.Since(t.Time))
}

func rfc3339(t metav1.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// redactURL hides a password a URL might carry; tool output never holds
// credentials.
func redactURL(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(a URL that cannot be parsed; hidden because it may hold credentials)"
	}
	if u.User == nil {
		return s
	}
	u.User = url.User("xxxxx")
	return u.String()
}
