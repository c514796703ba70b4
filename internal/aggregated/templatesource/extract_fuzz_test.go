package templatesource

import (
	"archive/zip"
	"bytes"
	"path"
	"strings"
	"testing"
)

// Template archives come from coderd, which stores whatever was uploaded:
// Extract never panics, and what it accepts respects every limit.
func FuzzExtract(f *testing.F) {
	limits := Limits{MaxFiles: 20, MaxFileBytes: 4096, MaxTotalBytes: 16384}
	if tarball, err := Archive(map[string]string{"main.tf": "output \"x\" { value = 1 }\n", "dir/a.txt": "a"}, DefaultLimits); err == nil {
		f.Add(tarball)
	}
	var zbuf bytes.Buffer
	zw := zip.NewWriter(&zbuf)
	if w, err := zw.Create("main.tf"); err == nil {
		_, _ = w.Write([]byte(strings.Repeat("x", 100)))
	}
	_ = zw.Close()
	f.Add(zbuf.Bytes())
	f.Add([]byte("PK\x03\x04"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		files, err := Extract(data, limits)
		if err != nil {
			return
		}
		if len(files) > limits.MaxFiles {
			t.Fatalf("%d files, limit %d", len(files), limits.MaxFiles)
		}
		var total int64
		for p, content := range files {
			if path.IsAbs(p) || path.Clean(p) != p || strings.HasPrefix(p, "../") || p == ".." {
				t.Fatalf("unsafe path %q", p)
			}
			if int64(len(content)) > limits.MaxFileBytes {
				t.Fatalf("%s: %d bytes, limit %d", p, len(content), limits.MaxFileBytes)
			}
			total += int64(len(content))
		}
		if total > limits.MaxTotalBytes {
			t.Fatalf("%d bytes in total, limit %d", total, limits.MaxTotalBytes)
		}
	})
}
