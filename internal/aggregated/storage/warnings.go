package storage

import (
	"context"
	"sort"
	"strings"
	"sync"

	"k8s.io/apiserver/pkg/warning"
)

// warnings collects what a list or watch tells the client in Warning
// headers (kubectl prints them): one line per reason, naming every
// backend it applies to.
type warnings struct {
	mu     sync.Mutex
	byWhy  map[string][]string
	reason []string
}

func (w *warnings) add(why, what string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byWhy == nil {
		w.byWhy = map[string][]string{}
	}
	if _, ok := w.byWhy[why]; !ok {
		w.reason = append(w.reason, why)
	}
	w.byWhy[why] = append(w.byWhy[why], what)
}

// send adds the warnings to the response.
func (w *warnings) send(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, why := range w.reason {
		what := w.byWhy[why]
		sort.Strings(what)
		warning.AddWarning(ctx, "", why+": "+strings.Join(dedupe(what), "; "))
	}
}

func dedupe(s []string) []string {
	out := s[:0:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
