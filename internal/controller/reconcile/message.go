package reconcile

import "github.com/coder/coder-k8s/internal/truncate"

// MaxMessage bounds the condition messages and event notes the
// reconcilers write: the events.k8s.io API refuses notes over 1024 bytes,
// and one limit keeps a condition and the event announcing it identical.
const MaxMessage = 1024

// Message cuts s to MaxMessage bytes on a rune boundary.
func Message(s string) string { return truncate.String(s, MaxMessage) }
