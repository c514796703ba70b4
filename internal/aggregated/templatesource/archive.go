package templatesource

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// epoch is every archive entry's modification time: a fixed time keeps
// the archive a function of the files alone.
var epoch = time.Unix(0, 0).UTC()

// Archive packs files into a tar archive coderd can build, after checking
// them as Validate does (a problem comes back as a *FileError). The
// archive is deterministic — sorted paths, fixed modes (0644 files, 0755
// for the implied parent directories), a fixed modification time, no
// owners — so identical files give identical bytes and coderd, which
// deduplicates uploads by hash, stores them once.
func Archive(files map[string]string, limits Limits) ([]byte, error) {
	if probs := check(files, limits.withDefaults()); len(probs) > 0 {
		return nil, probs[0].fileError()
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, p := range sortedPaths(files) {
		// The provisioner creates files without their parents, so every
		// directory must come before its first file.
		for _, d := range newParents(p, dirs) {
			if err := tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch,
			}); err != nil {
				return nil, fmt.Errorf("archive directory %q: %w", d, err)
			}
		}
		content := files[p]
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: p, Mode: 0o644, Size: int64(len(content)), ModTime: epoch,
		}); err != nil {
			return nil, fmt.Errorf("archive file %q: %w", p, err)
		}
		if _, err := io.WriteString(tw, content); err != nil {
			return nil, fmt.Errorf("archive file %q: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("archive template source: %w", err)
	}
	return buf.Bytes(), nil
}

// newParents returns p's parent directories not yet in seen, outermost
// first, and adds them to seen.
func newParents(p string, seen map[string]bool) []string {
	var parents []string
	for d := path.Dir(p); d != "." && !seen[d]; d = path.Dir(d) {
		seen[d] = true
		parents = append(parents, d)
	}
	for i, j := 0, len(parents)-1; i < j; i, j = i+1, j-1 {
		parents[i], parents[j] = parents[j], parents[i]
	}
	return parents
}

// Zip archives start with a local file header, or (when empty) with the
// end of central directory record.
var (
	zipMagic      = []byte("PK\x03\x04")
	emptyZipMagic = []byte("PK\x05\x06")
)

// Extract unpacks a template source archive — a tar, or a zip (what
// coderd's GET /api/v2/files/{id} may return) — into spec.files form.
// Directories are skipped; a "./" prefix is dropped. Every problem comes
// back as a *FileError naming the entry: unsafe paths, links and devices,
// more than limits.MaxFiles files, a file whose declared or actual size
// exceeds limits.MaxFileBytes (reads are bounded, so a lying header cannot
// make it allocate more), a total over limits.MaxTotalBytes, duplicate
// paths, and content that is not UTF-8 (spec.files holds text).
func Extract(data []byte, limits Limits) (map[string]string, error) {
	x := &extractor{limits: limits.withDefaults(), files: map[string]string{}}
	var err error
	if bytes.HasPrefix(data, zipMagic) || bytes.HasPrefix(data, emptyZipMagic) {
		err = x.zip(data)
	} else {
		err = x.tar(data)
	}
	if err == nil {
		err = x.checkConflicts()
	}
	if err != nil {
		return nil, err
	}
	return x.files, nil
}

type extractor struct {
	limits Limits
	files  map[string]string
	total  int64
}

func (x *extractor) tar(data []byte) error {
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return &FileError{Reason: fmt.Sprintf("read tar archive: %v", err)}
		}
		switch h.Typeflag {
		case tar.TypeXGlobalHeader:
			// PAX global headers (git archive writes one) hold no file.
			continue
		case tar.TypeDir:
			if err := x.dir(h.Name); err != nil {
				return err
			}
		case tar.TypeReg:
			// The tar reader never reports a negative size.
			if err := x.file(h.Name, uint64(max(h.Size, 0)), tr); err != nil {
				return err
			}
		default:
			return &FileError{Path: h.Name, Reason: fmt.Sprintf("is a %s; only regular files and directories are allowed", tarTypeName(h.Typeflag))}
		}
	}
}

func tarTypeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	default:
		return fmt.Sprintf("tar entry of type %q", t)
	}
}

func (x *extractor) zip(data []byte) error {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	// ErrInsecurePath still returns a usable reader; names are checked
	// below, entry by entry, so the error can name the entry.
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return &FileError{Reason: fmt.Sprintf("read zip archive: %v", err)}
	}
	for _, f := range zr.File {
		mode := f.Mode()
		switch {
		case mode.IsDir() || strings.HasSuffix(f.Name, "/"):
			if err := x.dir(f.Name); err != nil {
				return err
			}
		case mode&fs.ModeSymlink != 0:
			return &FileError{Path: f.Name, Reason: "is a symbolic link; only regular files and directories are allowed"}
		case !mode.IsRegular():
			return &FileError{Path: f.Name, Reason: fmt.Sprintf("is a special file (mode %s); only regular files and directories are allowed", mode)}
		default:
			if err := x.zipFile(f); err != nil {
				return err
			}
		}
	}
	return nil
}

func (x *extractor) zipFile(f *zip.File) error {
	// Path rules first, so an unsafe name is reported as such even when
	// the entry cannot be opened (say, an unknown compression method).
	if _, err := x.name(f.Name); err != nil {
		return err
	}
	rc, err := f.Open()
	if err != nil {
		return &FileError{Path: f.Name, Reason: fmt.Sprintf("open: %v", err)}
	}
	defer rc.Close()
	return x.file(f.Name, f.UncompressedSize64, rc)
}

// trimDotSlash drops the "./" prefixes `tar -C dir .` writes.
func trimDotSlash(p string) string {
	for strings.HasPrefix(p, "./") {
		p = p[2:]
	}
	return p
}

// name turns an entry name into a spec.files path.
func (x *extractor) name(raw string) (string, error) {
	p := trimDotSlash(raw)
	if reason := pathProblem(p); reason != "" {
		return "", &FileError{Path: raw, Reason: reason}
	}
	return p, nil
}

func (x *extractor) dir(raw string) error {
	p := strings.TrimSuffix(trimDotSlash(raw), "/")
	if p == "" || p == "." {
		return nil // the archive's root
	}
	// Directories add nothing to the files, but an unsafe one shows the
	// archive was not made for a template.
	if reason := pathProblem(p); reason != "" {
		return &FileError{Path: raw, Reason: reason}
	}
	return nil
}

// file adds the entry raw, of declared size, read from r.
func (x *extractor) file(raw string, declared uint64, r io.Reader) error {
	p, err := x.name(raw)
	if err != nil {
		return err
	}
	if _, dup := x.files[p]; dup {
		return &FileError{Path: raw, Reason: "appears more than once in the archive"}
	}
	if len(x.files) >= x.limits.MaxFiles {
		return &FileError{Path: raw, Reason: fmt.Sprintf("is beyond the limit of %d files", x.limits.MaxFiles)}
	}
	if declared > uint64(x.limits.MaxFileBytes) {
		return &FileError{Path: raw, Reason: fmt.Sprintf("declares %d bytes, more than the limit of %d", declared, x.limits.MaxFileBytes)}
	}
	if declared > uint64(x.limits.MaxTotalBytes-x.total) {
		return &FileError{Path: raw, Reason: fmt.Sprintf("brings the total to more than the limit of %d bytes", x.limits.MaxTotalBytes)}
	}
	// Read one byte past the limit to detect a header that understates
	// the size, without ever holding more than that.
	b, err := io.ReadAll(io.LimitReader(r, x.limits.MaxFileBytes+1))
	if errors.Is(err, zip.ErrFormat) || errors.Is(err, zip.ErrChecksum) {
		// Go's zip reader stops as soon as an entry inflates past its
		// declared size: the classic zip bomb.
		return &FileError{Path: raw, Reason: fmt.Sprintf("is corrupt or larger than its header declares: %v", err)}
	}
	if err != nil {
		return &FileError{Path: raw, Reason: fmt.Sprintf("read: %v", err)}
	}
	if int64(len(b)) > x.limits.MaxFileBytes {
		return &FileError{Path: raw, Reason: fmt.Sprintf("is larger than the limit of %d bytes", x.limits.MaxFileBytes)}
	}
	x.total += int64(len(b))
	if x.total > x.limits.MaxTotalBytes {
		return &FileError{Path: raw, Reason: fmt.Sprintf("brings the total to more than the limit of %d bytes", x.limits.MaxTotalBytes)}
	}
	if !utf8.Valid(b) {
		return &FileError{Path: raw, Reason: "is not UTF-8 text; spec.files holds text files only"}
	}
	x.files[p] = string(b)
	return nil
}

// checkConflicts rejects a file that sits below another file, which no
// filesystem (and so no provisioner) can hold.
func (x *extractor) checkConflicts() error {
	paths := make([]string, 0, len(x.files))
	for p := range x.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if parent := fileParent(x.files, p); parent != "" {
			return &FileError{Path: p, Reason: fmt.Sprintf("is inside %q, which is a file", parent)}
		}
	}
	return nil
}
