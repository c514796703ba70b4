package provisioner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// KeySecretKey is the key of the provisioner key in its Secret.
const KeySecretKey = "key"

// Annotations on the key Secret recording what the key in it was issued
// for. A mismatch with the spec (organization, tags) or with Coder (the
// key's ID) makes the reconciler rotate the key.
const (
	AnnotationKeyOrganizationID = "coder.com/provisioner-key-organization-id"
	AnnotationKeyName           = "coder.com/provisioner-key-name"
	AnnotationKeyID             = "coder.com/provisioner-key-id"
	AnnotationKeyTags           = "coder.com/provisioner-key-tags"
	// AnnotationKeyHash on the pod template holds a hash of the key's
	// identity (organization, name, ID): a new key rolls the pods.
	AnnotationKeyHash = "coder.com/provisioner-key-hash"
)

// maxKeyName is coderd's limit on provisioner key names.
const maxKeyName = 64

// keyIdentity names an issued provisioner key; it holds no secret.
type keyIdentity struct {
	OrganizationID, Name, ID string
}

// hash identifies the key in the pod template without revealing it.
func (k keyIdentity) hash() string {
	sum := sha256.Sum256([]byte(k.OrganizationID + "/" + k.Name + "/" + k.ID))
	return hex.EncodeToString(sum[:8])
}

func keySecretName(obj *coderv1alpha1.CoderProvisioner) string {
	return obj.Name + "-provisioner-key"
}

// keyName is the provisioner key's name in Coder: namespace and name, so
// objects of the same name in different namespaces do not collide in a
// shared organization; shortened with a hash beyond coderd's 64 characters.
func keyName(obj *coderv1alpha1.CoderProvisioner) string {
	name := obj.Namespace + "-" + obj.Name
	if len(name) <= maxKeyName {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:maxKeyName-9] + "-" + hex.EncodeToString(sum[:4])
}

// canonicalTags is the tags' JSON with sorted keys ("{}" for none).
func canonicalTags(tags map[string]string) string {
	if tags == nil {
		tags = map[string]string{}
	}
	b, _ := json.Marshal(tags) // a map[string]string always marshals
	return string(b)
}

func findKey(keys []codersdk.ProvisionerKey, name string) *codersdk.ProvisionerKey {
	for i := range keys {
		if keys[i].Name == name {
			return &keys[i]
		}
	}
	return nil
}

// ensureKey makes sure the Secret holds a live provisioner key issued for
// the spec's organization and tags, issuing or rotating it when not.
// keys is the organization's current list of keys.
func (r *Reconciler) ensureKey(ctx context.Context, obj *coderv1alpha1.CoderProvisioner, st *dependent.State, cl *codersdk.Client, orgID uuid.UUID, keys []codersdk.ProvisionerKey) (keyIdentity, error) {
	log := logf.FromContext(ctx)
	name := keyName(obj)
	tags := canonicalTags(obj.Spec.Tags)

	secretName := keySecretName(obj)
	secret, err := r.OwnedSecret(ctx, owner(obj), secretName)
	if err != nil {
		return keyIdentity{}, err
	}
	exists := secret != nil
	var ann map[string]string
	if exists {
		ann = secret.Annotations
	}
	current := findKey(keys, name)
	if exists && len(secret.Data[KeySecretKey]) > 0 && current != nil &&
		ann[AnnotationKeyOrganizationID] == orgID.String() && ann[AnnotationKeyName] == name &&
		ann[AnnotationKeyID] == current.ID.String() && ann[AnnotationKeyTags] == tags {
		return keyIdentity{OrganizationID: orgID.String(), Name: name, ID: current.ID.String()}, nil
	}

	// Issue (or re-issue) the key. First revoke the key the Secret was
	// issued for when it lives elsewhere (another organization or name),
	// then any key of the target name: coderd has no key update, and
	// names are unique per organization.
	rotating := exists && ann[AnnotationKeyID] != ""
	if rotating && (ann[AnnotationKeyOrganizationID] != orgID.String() || ann[AnnotationKeyName] != name) {
		if oldOrg, err := uuid.Parse(ann[AnnotationKeyOrganizationID]); err == nil && ann[AnnotationKeyName] != "" {
			if err := cl.DeleteProvisionerKey(ctx, oldOrg, ann[AnnotationKeyName]); err != nil && !coderapi.IsNotFound(err) {
				return keyIdentity{}, fmt.Errorf("revoke old key %q in organization %s: %w", ann[AnnotationKeyName], oldOrg, err)
			}
		}
	}
	if current != nil {
		if err := cl.DeleteProvisionerKey(ctx, orgID, name); err != nil && !coderapi.IsNotFound(err) {
			return keyIdentity{}, fmt.Errorf("revoke key %q: %w", name, err)
		}
	}
	tagMap := maps.Clone(obj.Spec.Tags)
	if tagMap == nil {
		tagMap = map[string]string{}
	}
	created, err := cl.CreateProvisionerKey(ctx, orgID, codersdk.CreateProvisionerKeyRequest{Name: name, Tags: tagMap})
	if err != nil {
		return keyIdentity{}, fmt.Errorf("create key %q: %w", name, err)
	}
	// Anything failing from here leaves a key nobody holds: revoke it so
	// the next attempt starts clean.
	revokeNew := func() {
		if err := cl.DeleteProvisionerKey(ctx, orgID, name); err != nil && !coderapi.IsNotFound(err) {
			log.Error(err, "revoke provisioner key that could not be stored", "key", name)
		}
	}
	after, err := cl.ListProvisionerKeys(ctx, orgID)
	if err != nil {
		revokeNew()
		return keyIdentity{}, fmt.Errorf("list provisioner keys after creating %q: %w", name, err)
	}
	issued := findKey(after, name)
	if issued == nil {
		revokeNew()
		return keyIdentity{}, fmt.Errorf("key %q missing from the organization's keys right after its creation", name)
	}
	id := keyIdentity{OrganizationID: orgID.String(), Name: name, ID: issued.ID.String()}

	if err := r.StoreSecret(ctx, obj, secret, secretName, dependent.Credential{
		What: "key", Key: KeySecretKey, Value: created.Key, Labels: commonLabels(obj),
		Annotations: map[string]string{
			AnnotationKeyOrganizationID: id.OrganizationID,
			AnnotationKeyName:           id.Name,
			AnnotationKeyID:             id.ID,
			AnnotationKeyTags:           tags,
		},
	}); err != nil {
		revokeNew()
		return keyIdentity{}, err
	}

	if rotating {
		st.Event(corev1.EventTypeNormal, EventKeyRotated, "RotateKey",
			fmt.Sprintf("rotated provisioner key %q (organization %s, tags %s); the daemons restart with the new key", name, orgID, tags))
	} else {
		st.Event(corev1.EventTypeNormal, EventKeyIssued, "IssueKey",
			fmt.Sprintf("issued provisioner key %q (organization %s, tags %s) into Secret %s", name, orgID, tags, secretName))
	}
	log.Info("provisioner key issued", "key", name, "organization", orgID, "rotated", rotating)
	return id, nil
}

// issuedKey names the key the object holds in Coder and how to revoke it;
// a nil revoke means none was issued. The key Secret's annotations win
// over the status, which may lag behind an issue; a Secret the object
// does not control is not its own.
func (r *Reconciler) issuedKey(ctx context.Context, obj *coderv1alpha1.CoderProvisioner) (string, dependent.UndoFunc, error) {
	orgID, name := obj.Status.OrganizationID, obj.Status.KeyName
	secret, err := r.OwnedSecret(ctx, owner(obj), keySecretName(obj))
	var foreign *workload.ConflictError
	switch {
	case err == nil && secret != nil && secret.Annotations[AnnotationKeyName] != "":
		orgID, name = secret.Annotations[AnnotationKeyOrganizationID], secret.Annotations[AnnotationKeyName]
	case err != nil && !errors.As(err, &foreign):
		return "", nil, err
	}
	org, perr := uuid.Parse(orgID)
	if name == "" || perr != nil {
		return "", nil, nil
	}
	revoke := func(ctx context.Context, cl *codersdk.Client) error {
		return cl.DeleteProvisionerKey(ctx, org, name)
	}
	return fmt.Sprintf("provisioner key %q in organization %s", name, orgID), revoke, nil
}
