// Package templatesource converts a CoderTemplate's spec.files (path →
// content) to the tar archive coderd builds and back, within size limits;
// uploads and downloads template sources (downloads through an immutable
// cache) and waits for coderd to build an uploaded version.
package templatesource

import (
	"fmt"
	"path"
	"sort"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Limits bounds a template source. A zero field means the DefaultLimits
// value, so a zero Limits is usable.
type Limits struct {
	// MaxFiles is the most files a template may hold.
	MaxFiles int
	// MaxFileBytes is the largest one file may be.
	MaxFileBytes int64
	// MaxTotalBytes is the most all files together may hold.
	MaxTotalBytes int64
}

// DefaultLimits keeps a template small enough to travel in one Kubernetes
// object and one coderd upload.
var DefaultLimits = Limits{MaxFiles: 1000, MaxFileBytes: 1 << 20, MaxTotalBytes: 4 << 20}

// Path length limits of common filesystems (NAME_MAX, PATH_MAX): longer
// names could not be extracted by the provisioner.
const (
	maxSegmentBytes = 255
	maxPathBytes    = 4096
)

func (l Limits) withDefaults() Limits {
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultLimits.MaxFiles
	}
	if l.MaxFileBytes <= 0 {
		l.MaxFileBytes = DefaultLimits.MaxFileBytes
	}
	if l.MaxTotalBytes <= 0 {
		l.MaxTotalBytes = DefaultLimits.MaxTotalBytes
	}
	return l
}

// FileError is a problem with a template source: a file that breaks a
// limit or a rule, or (with an empty Path) the source as a whole. It is
// the caller's fault, not coderd's: an API server should answer 422 and
// name the file.
type FileError struct {
	// Path is the file's path as the source or archive spells it; empty
	// when the problem is not one file's.
	Path string
	// Reason says what is wrong, for people.
	Reason string
}

func (e *FileError) Error() string {
	if e.Path == "" {
		return "template source: " + e.Reason
	}
	return fmt.Sprintf("template file %q: %s", e.Path, e.Reason)
}

type problemKind int

const (
	badPath problemKind = iota
	badContent
	fileTooLong
	tooManyFiles
	totalTooLong
	missingTerraform
)

// problem is one validation finding, kept independent of field.Error so
// that Validate and Archive report the same findings.
type problem struct {
	kind   problemKind
	path   string
	reason string
	n      int64 // the actual count, for tooManyFiles
}

func (p problem) fileError() *FileError { return &FileError{Path: p.path, Reason: p.reason} }

// Validate checks files (spec.files) against limits and the rules every
// template source must follow, returning every problem in a deterministic
// order; per-file errors name the file with fldPath.Key(path).
func Validate(files map[string]string, limits Limits, fldPath *field.Path) field.ErrorList {
	limits = limits.withDefaults()
	var errs field.ErrorList
	for _, p := range check(files, limits) {
		switch p.kind {
		case badPath:
			errs = append(errs, field.Invalid(fldPath.Key(p.path), p.path, p.reason))
		case badContent:
			// The content may be large: leave it out of the message.
			errs = append(errs, field.Invalid(fldPath.Key(p.path), field.OmitValueType{}, p.reason))
		case fileTooLong:
			errs = append(errs, field.TooLong(fldPath.Key(p.path), nil, int(limits.MaxFileBytes)))
		case tooManyFiles:
			errs = append(errs, field.TooMany(fldPath, int(p.n), limits.MaxFiles))
		case totalTooLong:
			errs = append(errs, field.TooLong(fldPath, nil, int(limits.MaxTotalBytes)))
		case missingTerraform:
			errs = append(errs, field.Required(fldPath, p.reason))
		}
	}
	return errs
}

// check returns every problem with files, sorted by path.
func check(files map[string]string, limits Limits) []problem {
	if len(files) > limits.MaxFiles {
		// Per-file findings for an oversized map would only bury this one.
		return []problem{{
			kind:   tooManyFiles,
			n:      int64(len(files)),
			reason: fmt.Sprintf("has %d files, more than the limit of %d", len(files), limits.MaxFiles),
		}}
	}
	var probs []problem
	paths := sortedPaths(files)
	hasTerraform := false
	var total int64
	for _, p := range paths {
		content := files[p]
		total += int64(len(content))
		if reason := pathProblem(p); reason != "" {
			probs = append(probs, problem{kind: badPath, path: p, reason: reason})
		} else {
			if isRootTerraform(p) {
				hasTerraform = true
			}
			if parent := fileParent(files, p); parent != "" {
				probs = append(probs, problem{kind: badPath, path: p,
					reason: fmt.Sprintf("is inside %q, which is a file: a path cannot be both a file and a directory", parent)})
			}
		}
		switch {
		case int64(len(content)) > limits.MaxFileBytes:
			probs = append(probs, problem{kind: fileTooLong, path: p,
				reason: fmt.Sprintf("is %d bytes, more than the limit of %d", len(content), limits.MaxFileBytes)})
		case !utf8.ValidString(content):
			probs = append(probs, problem{kind: badContent, path: p, reason: "must be UTF-8 text"})
		}
	}
	if !hasTerraform {
		// Prepended: without Terraform the other findings matter less.
		probs = append([]problem{{kind: missingTerraform,
			reason: "at least one top-level *.tf file is required: Coder builds templates with Terraform"}}, probs...)
	}
	if total > limits.MaxTotalBytes {
		probs = append(probs, problem{kind: totalTooLong,
			reason: fmt.Sprintf("files total %d bytes, more than the limit of %d", total, limits.MaxTotalBytes)})
	}
	return probs
}

// pathProblem says why p cannot name a template file, or returns "".
// These are the paths coderd's provisioner extracts into its work
// directory unchanged (filepath.IsLocal) and that round-trip through a tar.
func pathProblem(p string) string {
	switch {
	case p == "":
		return "file names must not be empty"
	case strings.IndexByte(p, 0) >= 0:
		return "must not contain NUL bytes"
	case !utf8.ValidString(p):
		return "must be valid UTF-8"
	case strings.Contains(p, `\`):
		return `must use "/" to separate directories; backslashes are not allowed`
	case strings.HasPrefix(p, "/"):
		return "must be a relative path, not an absolute one"
	case hasDotDot(p):
		return `must not contain ".." segments`
	case p == "." || path.Clean(p) != p:
		return `must be a clean relative file path (no "." segments, "//" or trailing "/")`
	case len(p) > maxPathBytes:
		return fmt.Sprintf("is %d bytes long, more than %d", len(p), maxPathBytes)
	}
	for seg := range strings.SplitSeq(p, "/") {
		if len(seg) > maxSegmentBytes {
			return fmt.Sprintf("has a name of %d bytes, more than %d", len(seg), maxSegmentBytes)
		}
	}
	return ""
}

func hasDotDot(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return true
		}
	}
	return false
}

// isRootTerraform reports a file Terraform loads from the root module:
// *.tf or *.tf.json at the top level, not hidden (Terraform skips names
// starting with "." or "#").
func isRootTerraform(p string) bool {
	if strings.Contains(p, "/") || strings.HasPrefix(p, ".") || strings.HasPrefix(p, "#") {
		return false
	}
	return strings.HasSuffix(p, ".tf") || strings.HasSuffix(p, ".tf.json")
}

// fileParent returns the nearest parent directory of p that files also
// holds as a file, or "".
func fileParent(files map[string]string, p string) string {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := files[d]; ok {
			return d
		}
	}
	return ""
}

func sortedPaths(files map[string]string) []string {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}
