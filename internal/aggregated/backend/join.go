package backend

import (
	"context"
	"errors"
	"sort"
)

// Join serves the backends of every provider: in all mode, a static
// backend from the configuration next to the discovered control planes.
func Join(providers ...Provider) Provider { return joined(providers) }

type joined []Provider

func (j joined) Backends(ctx context.Context, namespace string) ([]Backend, error) {
	var out []Backend
	for _, p := range j {
		bs, err := p.Backends(ctx, namespace)
		if err != nil {
			return nil, err
		}
		out = append(out, bs...)
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Namespace != out[b].Namespace {
			return out[a].Namespace < out[b].Namespace
		}
		return out[a].ControlPlane < out[b].ControlPlane
	})
	return out, nil
}

func (j joined) Ready() error {
	var errs []error
	for _, p := range j {
		if err := p.Ready(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
