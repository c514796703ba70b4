package dependent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coder/coder-k8s/internal/controller/workload"
)

// OwnedSecret reads, uncached, the Secret called name in the namespace of
// owner.Object, which holds a credential the object owns: nil when there
// is none, a *workload.ConflictError when it exists and the object does
// not control it.
func (b *Base) OwnedSecret(ctx context.Context, owner workload.Owner, name string) (*corev1.Secret, error) {
	var secret corev1.Secret
	ns := owner.Object.GetNamespace()
	if err := b.APIReader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read Secret %s: %w", name, err)
	}
	if !metav1.IsControlledBy(&secret, owner.Object) {
		return nil, workload.NotManaged("Secret", ns, name, owner.Kind)
	}
	return &secret, nil
}

// Credential is what StoreSecret writes into an owned Secret.
type Credential struct {
	// What names the credential in errors ("key").
	What string
	// Key is the Secret's key holding Value.
	Key, Value string
	// Labels and Annotations (what the credential was issued for) are
	// merged into the Secret's own.
	Labels, Annotations map[string]string
}

// StoreSecret writes c into secret, an owned Secret as OwnedSecret read
// it, or creates the Secret called name when secret is nil, controlled by
// owner.
func (b *Base) StoreSecret(ctx context.Context, owner metav1.Object, secret *corev1.Secret, name string, c Credential) error {
	create := secret == nil
	if create {
		secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: owner.GetNamespace(), Name: name}}
	}
	secret.Labels = workload.MergeMaps(secret.Labels, c.Labels)
	secret.Annotations = workload.MergeMaps(secret.Annotations, c.Annotations)
	secret.Type = corev1.SecretTypeOpaque
	secret.Data = map[string][]byte{c.Key: []byte(c.Value)}
	if err := workload.SetOwner(owner, secret, b.Scheme); err != nil {
		return err
	}
	var err error
	if create {
		err = b.Client.Create(ctx, secret)
	} else {
		err = b.Client.Update(ctx, secret)
	}
	if err != nil {
		return fmt.Errorf("store %s in Secret %s: %w", c.What, secret.Name, err)
	}
	return nil
}
