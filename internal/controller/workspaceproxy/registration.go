package workspaceproxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// TokenSecretKey is the key of the proxy token in the Secret the operator
// owns.
const TokenSecretKey = "token"

// Annotations on the token Secret recording the registration its token
// belongs to.
const (
	AnnotationProxyID = "coder.com/workspace-proxy-id"
	// AnnotationTokenIssuedAt changes whenever a new token is stored.
	AnnotationTokenIssuedAt = "coder.com/workspace-proxy-token-issued-at"
	// AnnotationTokenHash on the pod template holds a hash of the token's
	// identity (proxy ID and issue time, or the supplied Secret's version),
	// never of the token: a new token rolls the pods.
	AnnotationTokenHash = "coder.com/workspace-proxy-token-hash"
)

// credentials is what the proxy runs with.
type credentials struct {
	ref     coderv1alpha1.SecretKeyReference
	proxyID string
	// identity changes whenever the token does; it holds no secret.
	identity string
}

func (c credentials) hash() string {
	sum := sha256.Sum256([]byte(c.ref.Name + "/" + c.ref.Key + "/" + c.identity))
	return hex.EncodeToString(sum[:8])
}

func tokenSecretName(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	return obj.Name + "-wsproxy-token"
}

// proxyName is the proxy's name in Coder: the object's name. A control
// plane serves one namespace, so two objects registering with the same
// coderd normally live in one namespace and cannot share a name; a
// collision (two namespaces adopting the same coderd) is reported as
// NameConflict.
func proxyName(obj *coderv1alpha1.CoderWorkspaceProxy) string { return obj.Name }

func displayName(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	if obj.Spec.DisplayName != "" {
		return obj.Spec.DisplayName
	}
	return obj.Name
}

func icon(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	if obj.Spec.Icon != "" {
		return obj.Spec.Icon
	}
	return DefaultIcon
}

func findProxy(proxies []codersdk.WorkspaceProxy, name string) *codersdk.WorkspaceProxy {
	for i := range proxies {
		if strings.EqualFold(proxies[i].Name, name) && !proxies[i].Deleted {
			return &proxies[i]
		}
	}
	return nil
}

// ownedTokenSecret reads the Secret holding the token of the proxy the
// operator registered; nil when there is none.
func (r *Reconciler) ownedTokenSecret(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy) (*corev1.Secret, error) {
	return r.OwnedSecret(ctx, owner(obj), tokenSecretName(obj))
}

// ensureRegistration registers the proxy in Coder when it is not, keeps
// its display name and icon in sync, and makes sure the owned Secret holds
// its token. proxies is coderd's current list.
func (r *Reconciler) ensureRegistration(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, st *dependent.State, cl *codersdk.Client, proxies []codersdk.WorkspaceProxy) (credentials, error) {
	name, display, iconURL := proxyName(obj), displayName(obj), icon(obj)
	secret, err := r.ownedTokenSecret(ctx, obj)
	if err != nil {
		return credentials{}, err
	}
	ref := coderv1alpha1.SecretKeyReference{Name: tokenSecretName(obj), Key: TokenSecretKey}

	found := findProxy(proxies, name)
	if found != nil {
		ours := secret != nil && len(secret.Data[TokenSecretKey]) > 0 && secret.Annotations[AnnotationProxyID] == found.ID.String()
		if !ours {
			if found.ID.String() != obj.Status.ProxyID {
				return credentials{}, &workload.ConflictError{Reason: coderv1alpha1.ReasonNameConflict,
					Msg: fmt.Sprintf("a workspace proxy named %q (ID %s) exists in Coder and was not registered by this object; delete it in Coder or rename this object", name, found.ID)}
			}
			// This object registered the proxy but its token is lost:
			// regenerate it.
			resp, err := cl.PatchWorkspaceProxy(ctx, codersdk.PatchWorkspaceProxy{
				ID: found.ID, Name: name, DisplayName: display, Icon: iconURL, RegenerateToken: true,
			})
			if err != nil {
				return credentials{}, fmt.Errorf("regenerate token of workspace proxy %q: %w", name, err)
			}
			issuedAt, err := r.storeToken(ctx, obj, secret, found.ID, resp.ProxyToken)
			if err != nil {
				return credentials{}, err
			}
			st.Event(corev1.EventTypeNormal, EventTokenRegenerated, "RegenerateToken",
				fmt.Sprintf("regenerated the token of workspace proxy %q into Secret %s", name, ref.Name))
			return credentials{ref: ref, proxyID: found.ID.String(), identity: found.ID.String() + "/" + issuedAt}, nil
		}
		if found.DisplayName != display || found.IconURL != iconURL {
			if _, err := cl.PatchWorkspaceProxy(ctx, codersdk.PatchWorkspaceProxy{
				ID: found.ID, Name: name, DisplayName: display, Icon: iconURL,
			}); err != nil {
				return credentials{}, fmt.Errorf("update workspace proxy %q: %w", name, err)
			}
			st.Event(corev1.EventTypeNormal, EventProxyUpdated, "UpdateProxy",
				fmt.Sprintf("workspace proxy %q: display name %q, icon %q", name, display, iconURL))
		}
		return credentials{ref: ref, proxyID: found.ID.String(), identity: found.ID.String() + "/" + secret.Annotations[AnnotationTokenIssuedAt]}, nil
	}

	// Not registered (or deleted in Coder behind the operator's back).
	resp, err := cl.CreateWorkspaceProxy(ctx, codersdk.CreateWorkspaceProxyRequest{Name: name, DisplayName: display, Icon: iconURL})
	if err != nil {
		return credentials{}, fmt.Errorf("create workspace proxy %q: %w", name, err)
	}
	id := resp.Proxy.ID
	issuedAt, err := r.storeToken(ctx, obj, secret, id, resp.ProxyToken)
	if err != nil {
		// Nobody holds the token: delete the registration so the next
		// attempt starts clean.
		if derr := cl.DeleteWorkspaceProxyByID(ctx, id); derr != nil && !coderapi.IsNotFound(derr) {
			logf.FromContext(ctx).Error(derr, "delete workspace proxy whose token could not be stored", "proxy", name)
		}
		return credentials{}, err
	}
	st.Event(corev1.EventTypeNormal, EventProxyRegistered, "RegisterProxy",
		fmt.Sprintf("registered workspace proxy %q (ID %s); its token is in Secret %s", name, id, ref.Name))
	return credentials{ref: ref, proxyID: id.String(), identity: id.String() + "/" + issuedAt}, nil
}

// storeToken writes token into the owned Secret (creating it when secret
// is nil) and returns the issue time recorded with it.
func (r *Reconciler) storeToken(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, secret *corev1.Secret, proxyID uuid.UUID, token string) (string, error) {
	if token == "" {
		return "", fmt.Errorf("coderd returned no token for workspace proxy %s", proxyID)
	}
	issuedAt := time.Now().UTC().Format(time.RFC3339Nano)
	if err := r.StoreSecret(ctx, obj, secret, tokenSecretName(obj), dependent.Credential{
		What: "proxy token", Key: TokenSecretKey, Value: token, Labels: commonLabels(obj),
		Annotations: map[string]string{
			AnnotationProxyID:       proxyID.String(),
			AnnotationTokenIssuedAt: issuedAt,
		},
	}); err != nil {
		return "", err
	}
	return issuedAt, nil
}

// suppliedCredentials checks the Secret of spec.proxyTokenSecretRef. The
// proxy's ID is read from the token, whose first part it is
// ("<id>:<secret>"); ok is false when the Secret or its key is missing.
func (r *Reconciler) suppliedCredentials(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy) (credentials, bool, error) {
	ref := *obj.Spec.ProxyTokenSecretRef
	var secret corev1.Secret
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: obj.Namespace, Name: ref.Name}, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return credentials{}, false, nil
		}
		return credentials{}, false, fmt.Errorf("read Secret %s: %w", ref.Name, err)
	}
	token := string(secret.Data[ref.Key])
	if token == "" {
		return credentials{}, false, nil
	}
	var proxyID string
	if before, _, found := strings.Cut(token, ":"); found {
		if id, err := uuid.Parse(before); err == nil {
			proxyID = id.String()
		}
	}
	// The Secret's version stands for the token: an edited Secret rolls
	// the pods (environment variables are read at start only).
	return credentials{ref: ref, proxyID: proxyID, identity: string(secret.UID) + "/" + secret.ResourceVersion}, true, nil
}

// dropRegistration deregisters the proxy this object registered before a
// token was supplied, and deletes its Secret.
func (r *Reconciler) dropRegistration(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy, st *dependent.State, cl *codersdk.Client) error {
	secret, err := r.ownedTokenSecret(ctx, obj)
	var conflict *workload.ConflictError
	if errors.As(err, &conflict) || (err == nil && secret == nil) {
		// Nothing registered, or a foreign Secret of that name, which is
		// none of this object's business once a token is supplied.
		return nil
	}
	if err != nil {
		return err
	}
	if id, perr := uuid.Parse(secret.Annotations[AnnotationProxyID]); perr == nil {
		if err := cl.DeleteWorkspaceProxyByID(ctx, id); err != nil && !coderapi.IsNotFound(err) {
			return fmt.Errorf("delete workspace proxy %s: %w", id, err)
		}
		st.Event(corev1.EventTypeNormal, EventProxyDeregistered, "DeregisterProxy",
			fmt.Sprintf("deregistered workspace proxy %s: spec.proxyTokenSecretRef now supplies the token", id))
	}
	if err := r.Client.Delete(ctx, secret); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Secret %s: %w", secret.Name, err)
	}
	return nil
}

// registeredProxy names the proxy the object registered and how to
// delete it; a nil deregister means it registered none.
func (r *Reconciler) registeredProxy(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy) (string, dependent.UndoFunc, error) {
	var id string
	secret, err := r.ownedTokenSecret(ctx, obj)
	switch {
	case err == nil && secret != nil:
		id = secret.Annotations[AnnotationProxyID]
	case err == nil && obj.Spec.ProxyTokenSecretRef == nil:
		// The Secret may be gone first (foreground deletion).
		id = obj.Status.ProxyID
	case err != nil:
		var conflict *workload.ConflictError
		if !errors.As(err, &conflict) {
			return "", nil, err
		}
	}
	proxyID, perr := uuid.Parse(id)
	if perr != nil {
		return "", nil, nil
	}
	deregister := func(ctx context.Context, cl *codersdk.Client) error {
		return cl.DeleteWorkspaceProxyByID(ctx, proxyID)
	}
	return fmt.Sprintf("workspace proxy %q (ID %s)", proxyName(obj), proxyID), deregister, nil
}
