package controllertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CountWrites wraps c in a WriteCounter.
func CountWrites(c client.Client) *WriteCounter { return &WriteCounter{Client: c} }

// WriteCounter is a client that counts the writes made through it, so a
// test can tell that a reconcile with nothing to do writes nothing.
type WriteCounter struct {
	client.Client
	writes atomic.Int64
	mu     sync.Mutex
	log    []string
}

func (c *WriteCounter) note(verb string, obj runtime.Object) {
	c.writes.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	desc := fmt.Sprintf("%s %T", verb, obj)
	if o, ok := obj.(client.Object); ok {
		desc += " " + o.GetNamespace() + "/" + o.GetName()
	}
	c.log = append(c.log, desc)
}

// Reset forgets the writes counted so far.
func (c *WriteCounter) Reset() {
	c.writes.Store(0)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.log = nil
}

// Written is the number of writes since the last Reset and what they were.
func (c *WriteCounter) Written() (int64, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes.Load(), slices.Clone(c.log)
}

func (c *WriteCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.note("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c *WriteCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.note("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c *WriteCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.note("patch", obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *WriteCounter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.note("apply", nil)
	return c.Client.Apply(ctx, obj, opts...)
}

func (c *WriteCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.note("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c *WriteCounter) Status() client.SubResourceWriter {
	return &countingStatus{SubResourceWriter: c.Client.Status(), c: c}
}

type countingStatus struct {
	client.SubResourceWriter
	c *WriteCounter
}

func (s *countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.note("status update", obj)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s *countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.note("status patch", obj)
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}
