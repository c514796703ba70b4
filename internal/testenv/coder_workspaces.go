package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
)

// Many workspaces at once: benchmarks seed hundreds to thousands of them
// through coderd's real API.

// Parallel calls f(0) … f(n-1), workers at a time, and returns every
// error they returned, joined.
func Parallel(n, workers int, f func(i int) error) error {
	next := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// CreateWorkspaces creates a workspace of tpl named names[i] for the first
// user, ten requests at a time, and waits until every one of tpl's
// workspaces has its first build done: len(names) running, none failed or
// canceled (the error then carries one failed build's error and logs).
// It counts by status (limit 1), since a list of every workspace would
// cost coderd more than the builds it waits for. progress, if not nil, is
// called about once a minute while builds run. ctx bounds the whole wait.
func (c *Coder) CreateWorkspaces(ctx context.Context, tpl codersdk.Template, names []string, progress func(done int, elapsed time.Duration)) ([]codersdk.Workspace, error) {
	if c.Client == nil {
		return nil, fmt.Errorf("create workspaces: coder has no first user (SkipFirstUser)")
	}
	start := time.Now()
	ws := make([]codersdk.Workspace, len(names))
	err := Parallel(len(names), 10, func(i int) error {
		w, err := c.Client.CreateUserWorkspace(ctx, codersdk.Me, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: names[i]})
		if err != nil {
			return fmt.Errorf("create workspace %s: %w", names[i], err)
		}
		ws[i] = w
		return nil
	})
	if err != nil {
		return nil, err
	}
	first := func(status codersdk.WorkspaceStatus) (codersdk.WorkspacesResponse, error) {
		res, err := c.Client.Workspaces(ctx, codersdk.WorkspaceFilter{Template: tpl.Name, Status: string(status), Limit: 1})
		if err != nil {
			return res, fmt.Errorf("count %s workspaces of template %s: %w", status, tpl.Name, err)
		}
		return res, nil
	}
	lastLog := time.Now()
	for {
		for _, status := range []codersdk.WorkspaceStatus{codersdk.WorkspaceStatusFailed, codersdk.WorkspaceStatusCanceled} {
			res, err := first(status)
			if err != nil {
				return nil, err
			}
			if res.Count > 0 && len(res.Workspaces) > 0 {
				w := res.Workspaces[0]
				_, err := c.WaitBuild(ctx, w.LatestBuild.ID)
				return nil, fmt.Errorf("template %s: %d workspace builds %s; %s: %w", tpl.Name, res.Count, status, w.Name, err)
			}
		}
		res, err := first(codersdk.WorkspaceStatusRunning)
		if err != nil {
			return nil, err
		}
		if res.Count == len(names) {
			return ws, nil
		}
		if progress != nil && time.Since(lastLog) > time.Minute {
			progress(res.Count, time.Since(start))
			lastLog = time.Now()
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return nil, fmt.Errorf("template %s: %d of %d workspace builds done after %s: %w", tpl.Name, res.Count, len(names), time.Since(start).Round(time.Second), err)
		}
	}
}
