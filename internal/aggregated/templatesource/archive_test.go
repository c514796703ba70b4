package templatesource

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

var sampleFiles = map[string]string{
	"main.tf":                    "locals {\n  x = 1\n}\n",
	"README.md":                  "# Template\n",
	"modules/agent/main.tf":      "variable \"y\" {}\n",
	"modules/agent/scripts/a.sh": "#!/bin/sh\n",
	"modules/b.tf":               "",
	"z.txt":                      "ünïcödé\n",
	strings.Repeat("long-name/", 20) + "file.tf": "long path, split into the ustar prefix\n",
	"pax/" + strings.Repeat("n", 200) + ".txt":   "long name needs a PAX header\n",
}

func TestArchiveIsDeterministic(t *testing.T) {
	first, err := Archive(sampleFiles, DefaultLimits)
	if err != nil {
		t.Fatalf("Archive() error = %v", err)
	}
	for i := range 20 {
		// A fresh map each time: insertion and iteration order differ.
		files := map[string]string{}
		for _, p := range sortedPaths(sampleFiles) {
			files[p] = sampleFiles[p]
		}
		again, err := Archive(files, DefaultLimits)
		if err != nil {
			t.Fatalf("Archive() error = %v", err)
		}
		if !bytes.Equal(first, again) {
			t.Fatalf("run %d: Archive() gave different bytes for the same files", i)
		}
	}
}

func TestArchiveLayout(t *testing.T) {
	data, err := Archive(sampleFiles, DefaultLimits)
	if err != nil {
		t.Fatalf("Archive() error = %v", err)
	}
	tr := tar.NewReader(bytes.NewReader(data))
	seenDirs := map[string]bool{}
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		names = append(names, h.Name)
		if strings.HasPrefix(h.Name, "pax/n") && h.Format&tar.FormatPAX == 0 {
			t.Errorf("%s: format %v, want PAX for a name ustar cannot hold", h.Name, h.Format)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v uid %d gid %d uname %q gname %q, want zero values", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if h.Mode != 0o755 || !strings.HasSuffix(h.Name, "/") {
				t.Errorf("directory %s: mode %o, want 0755 and a trailing slash", h.Name, h.Mode)
			}
			seenDirs[strings.TrimSuffix(h.Name, "/")] = true
		case tar.TypeReg:
			if h.Mode != 0o644 {
				t.Errorf("file %s: mode %o, want 0644", h.Name, h.Mode)
			}
			// The provisioner does not create parents: they must come first.
			for d := parentDir(h.Name); d != "."; d = parentDir(d) {
				if !seenDirs[d] {
					t.Errorf("file %s comes before its directory %s", h.Name, d)
				}
			}
			body, _ := io.ReadAll(tr)
			if string(body) != sampleFiles[h.Name] {
				t.Errorf("file %s = %q, want %q", h.Name, body, sampleFiles[h.Name])
			}
		default:
			t.Errorf("%s: unexpected type %q", h.Name, h.Typeflag)
		}
	}
	wantStart := []string{"README.md", "long-name/"}
	if !reflect.DeepEqual(names[:2], wantStart) {
		t.Errorf("archive starts with %q, want %q (sorted)", names[:2], wantStart)
	}
}

func parentDir(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[:i]
	}
	return "."
}

func TestArchiveExtractRoundTrip(t *testing.T) {
	data, err := Archive(sampleFiles, DefaultLimits)
	if err != nil {
		t.Fatalf("Archive() error = %v", err)
	}
	got, err := Extract(data, DefaultLimits)
	if err != nil {
		t.Fatalf("Extract() error = %v", err)
	}
	if !reflect.DeepEqual(got, sampleFiles) {
		t.Fatalf("Extract(Archive(files)) = %q, want %q", got, sampleFiles)
	}
}

// tarEntry is one header (and body, for regular files) of a test tar.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func reg(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}, body: body}
}

func buildTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.hdr); err != nil {
			t.Fatalf("write header %s: %v", e.hdr.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("write %s: %v", e.hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// zipEntry is one entry of a test zip; raw entries carry their header
// verbatim (sizes included) and already-deflated data.
type zipEntry struct {
	hdr  zip.FileHeader
	body string
	raw  []byte
}

func buildZip(t *testing.T, entries ...zipEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range entries {
		if e.raw != nil {
			w, err := zw.CreateRaw(&e.hdr)
			if err != nil {
				t.Fatalf("create raw %s: %v", e.hdr.Name, err)
			}
			if _, err := w.Write(e.raw); err != nil {
				t.Fatal(err)
			}
			continue
		}
		w, err := zw.CreateHeader(&e.hdr)
		if err != nil {
			t.Fatalf("create %s: %v", e.hdr.Name, err)
		}
		if _, err := io.WriteString(w, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zipFile(name, body string) zipEntry {
	return zipEntry{hdr: zip.FileHeader{Name: name, Method: zip.Deflate}, body: body}
}

// deflatedZeros returns n zero bytes deflated, and their CRC-32.
func deflatedZeros(t *testing.T, n int) ([]byte, uint32) {
	t.Helper()
	var buf bytes.Buffer
	fw, err := flate.NewWriter(&buf, flate.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	crc := crc32.NewIEEE()
	for left := n; left > 0; left -= len(zeros) {
		chunk := zeros[:min(left, len(zeros))]
		_, _ = fw.Write(chunk)
		_, _ = crc.Write(chunk)
	}
	if err := fw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), crc.Sum32()
}

func TestExtractAcceptsTarVariants(t *testing.T) {
	data := buildTar(t,
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "git"}}},
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755}},
		reg("./main.tf", "locals {}\n"),
		tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "./sub/", Mode: 0o755}},
		reg("./sub/x.txt", "x"),
		reg("empty.txt", ""),
	)
	got, err := Extract(data, DefaultLimits)
	if err != nil {
		t.Fatalf("Extract() error = %v", err)
	}
	want := map[string]string{"main.tf": "locals {}\n", "sub/x.txt": "x", "empty.txt": ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Extract() = %q, want %q", got, want)
	}

	got, err = Extract(nil, DefaultLimits)
	if err != nil || len(got) != 0 {
		t.Fatalf("Extract(empty) = %q, %v; want no files, no error", got, err)
	}
}

func TestExtractAcceptsZip(t *testing.T) {
	data := buildZip(t,
		zipEntry{hdr: zip.FileHeader{Name: "sub/"}},
		zipFile("main.tf", "locals {}\n"),
		zipFile("sub/x.txt", strings.Repeat("x", 5000)),
		zipEntry{hdr: zip.FileHeader{Name: "stored.txt", Method: zip.Store}, body: "stored"},
	)
	got, err := Extract(data, DefaultLimits)
	if err != nil {
		t.Fatalf("Extract() error = %v", err)
	}
	want := map[string]string{"main.tf": "locals {}\n", "sub/x.txt": strings.Repeat("x", 5000), "stored.txt": "stored"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Extract() = %q, want %q", got, want)
	}
	empty := buildZip(t)
	if got, err := Extract(empty, DefaultLimits); err != nil || len(got) != 0 {
		t.Fatalf("Extract(empty zip) = %q, %v; want no files, no error", got, err)
	}
}

func TestExtractRejects(t *testing.T) {
	small := Limits{MaxFiles: 3, MaxFileBytes: 100, MaxTotalBytes: 150}
	link := func(typ byte, name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: typ, Name: name, Linkname: target, Mode: 0o777}}
	}
	symlinkZip := zipEntry{hdr: zip.FileHeader{Name: "link"}, body: "/etc/passwd"}
	symlinkZip.hdr.SetMode(fs.ModeSymlink | 0o777)
	fifoZip := zipEntry{hdr: zip.FileHeader{Name: "pipe"}}
	fifoZip.hdr.SetMode(fs.ModeNamedPipe | 0o644)

	tests := []struct {
		name     string
		data     func(t *testing.T) []byte
		limits   Limits
		wantPath string
		reason   string
	}{
		{name: "tar dot-dot", data: func(t *testing.T) []byte { return buildTar(t, reg("main.tf", ""), reg("../x", "evil")) },
			wantPath: "../x", reason: `".." segments`},
		{name: "tar nested dot-dot", data: func(t *testing.T) []byte { return buildTar(t, reg("a/../../x", "evil")) },
			wantPath: "a/../../x", reason: `".." segments`},
		{name: "tar dot-dot directory", data: func(t *testing.T) []byte {
			return buildTar(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "../d/", Mode: 0o755}})
		}, wantPath: "../d/", reason: `".." segments`},
		{name: "tar absolute", data: func(t *testing.T) []byte { return buildTar(t, reg("/etc/cron.d/x", "evil")) },
			wantPath: "/etc/cron.d/x", reason: "absolute"},
		{name: "tar backslash", data: func(t *testing.T) []byte { return buildTar(t, reg(`..\x`, "evil")) },
			wantPath: `..\x`, reason: "backslashes"},
		{name: "tar symlink", data: func(t *testing.T) []byte { return buildTar(t, link(tar.TypeSymlink, "main.tf", "/etc/passwd")) },
			wantPath: "main.tf", reason: "symbolic link"},
		{name: "tar hard link", data: func(t *testing.T) []byte {
			return buildTar(t, reg("a", "x"), link(tar.TypeLink, "b", "a"))
		}, wantPath: "b", reason: "hard link"},
		{name: "tar character device", data: func(t *testing.T) []byte {
			return buildTar(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}})
		}, wantPath: "null", reason: "character device"},
		{name: "tar fifo", data: func(t *testing.T) []byte {
			return buildTar(t, tarEntry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo"}})
		}, wantPath: "fifo", reason: "FIFO"},
		{name: "tar 1001 files", limits: DefaultLimits, data: func(t *testing.T) []byte {
			entries := make([]tarEntry, 0, 1001)
			for i := range 1001 {
				entries = append(entries, reg(fmt.Sprintf("f%04d.tf", i), ""))
			}
			return buildTar(t, entries...)
		}, wantPath: "f1000.tf", reason: "limit of 1000 files"},
		{name: "tar file too big", data: func(t *testing.T) []byte { return buildTar(t, reg("big", strings.Repeat("x", 101))) },
			wantPath: "big", reason: "declares 101 bytes"},
		{name: "tar total too big", data: func(t *testing.T) []byte {
			return buildTar(t, reg("a", strings.Repeat("x", 100)), reg("b", strings.Repeat("x", 51)))
		}, wantPath: "b", reason: "total"},
		{name: "tar non-UTF-8", data: func(t *testing.T) []byte { return buildTar(t, reg("main.tf", ""), reg("icon.png", "\x89PNG\xff\xfe")) },
			wantPath: "icon.png", reason: "not UTF-8"},
		{name: "tar duplicate", data: func(t *testing.T) []byte { return buildTar(t, reg("main.tf", "a"), reg("./main.tf", "b")) },
			wantPath: "./main.tf", reason: "more than once"},
		{name: "tar file under a file", data: func(t *testing.T) []byte { return buildTar(t, reg("a", "x"), reg("a/b", "y")) },
			wantPath: "a/b", reason: `inside "a"`},
		{name: "corrupt tar", data: func(t *testing.T) []byte { return []byte(strings.Repeat("not a tar ", 100)) },
			wantPath: "", reason: "read tar archive"},
		{name: "zip dot-dot", data: func(t *testing.T) []byte { return buildZip(t, zipFile("../../x", "evil")) },
			wantPath: "../../x", reason: `".." segments`},
		{name: "zip absolute", data: func(t *testing.T) []byte { return buildZip(t, zipFile("/tmp/x", "evil")) },
			wantPath: "/tmp/x", reason: "absolute"},
		{name: "zip symlink", data: func(t *testing.T) []byte { return buildZip(t, symlinkZip) },
			wantPath: "link", reason: "symbolic link"},
		{name: "zip special file", data: func(t *testing.T) []byte { return buildZip(t, fifoZip) },
			wantPath: "pipe", reason: "special file"},
		{name: "zip non-UTF-8", data: func(t *testing.T) []byte { return buildZip(t, zipFile("bin", "\xff\xfe\xfd")) },
			wantPath: "bin", reason: "not UTF-8"},
		{name: "zip file too big", data: func(t *testing.T) []byte { return buildZip(t, zipFile("big", strings.Repeat("x", 101))) },
			wantPath: "big", reason: "declares 101 bytes"},
		{name: "zip too many files", data: func(t *testing.T) []byte {
			return buildZip(t, zipFile("a", ""), zipFile("b", ""), zipFile("c", ""), zipFile("d", ""))
		}, wantPath: "d", reason: "limit of 3 files"},
		{name: "corrupt zip", data: func(t *testing.T) []byte { return []byte("PK\x03\x04 truncated") },
			wantPath: "", reason: "read zip archive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limits := tt.limits
			if limits == (Limits{}) {
				limits = small
			}
			files, err := Extract(tt.data(t), limits)
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("Extract() = %q, %v; want a *FileError", files, err)
			}
			if files != nil {
				t.Errorf("Extract() returned files %q along with an error", files)
			}
			if fe.Path != tt.wantPath || !strings.Contains(fe.Reason, tt.reason) {
				t.Fatalf("Extract() error = %v (path %q), want path %q and a reason mentioning %q", err, fe.Path, tt.wantPath, tt.reason)
			}
		})
	}
}

// TestExtractZipBomb feeds zip entries that inflate to far more than
// MaxFileBytes: one whose header declares the true size, and ones whose
// headers lie. Each is rejected, naming the entry, without inflating it.
func TestExtractZipBomb(t *testing.T) {
	const inflated = 64 << 20
	bomb, crc := deflatedZeros(t, inflated)
	raw := func(name string, declared uint64) zipEntry {
		return zipEntry{raw: bomb, hdr: zip.FileHeader{
			Name: name, Method: zip.Deflate, CRC32: crc,
			CompressedSize64: uint64(len(bomb)), UncompressedSize64: declared,
		}}
	}
	tests := []struct {
		name     string
		declared uint64
		reason   string
	}{
		{name: "honest.tf", declared: inflated, reason: "declares 67108864 bytes"},
		{name: "lying-small.tf", declared: 100, reason: "larger than its header declares"},
		{name: "lying-at-limit.tf", declared: uint64(DefaultLimits.MaxFileBytes), reason: "larger than its header declares"},
		{name: "lying-huge.tf", declared: 1 << 63, reason: "declares 9223372036854775808 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := buildZip(t, zipFile("main.tf", "locals {}\n"), raw(tt.name, tt.declared))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := Extract(data, DefaultLimits)
			runtime.ReadMemStats(&after)
			var fe *FileError
			if !errors.As(err, &fe) || fe.Path != tt.name || !strings.Contains(fe.Reason, tt.reason) {
				t.Fatalf("Extract() error = %v, want a *FileError for %s mentioning %q", err, tt.name, tt.reason)
			}
			// Reading stops at MaxFileBytes+1; the inflate buffers and the
			// growth of that one read stay well under 16 MiB.
			if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16<<20 {
				t.Errorf("Extract() allocated %d bytes for a %d-byte bomb, want under 16 MiB", allocated, inflated)
			}
		})
	}
}

func TestFileErrorMessage(t *testing.T) {
	if got, want := (&FileError{Path: "a.tf", Reason: "is bad"}).Error(), `template file "a.tf": is bad`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := (&FileError{Reason: "is bad"}).Error(), "template source: is bad"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// endless is an endless stream of 'a's.
type endless struct{}

func (endless) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = 'a'
	}
	return len(b), nil
}

// TestExtractBoundsReads checks the guard behind the declared-size check:
// an entry whose reader yields more than its header declared is cut off
// at MaxFileBytes+1 bytes, whatever the archive reader does.
func TestExtractBoundsReads(t *testing.T) {
	x := &extractor{limits: Limits{MaxFileBytes: 1 << 10}.withDefaults(), files: map[string]string{}}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := x.file("endless.tf", 10, endless{})
	runtime.ReadMemStats(&after)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Path != "endless.tf" || !strings.Contains(fe.Reason, "larger than the limit of 1024 bytes") {
		t.Fatalf("file() error = %v, want a *FileError about the 1024-byte limit", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 64<<10 {
		t.Errorf("file() allocated %d bytes reading an endless entry, want under 64 KiB", allocated)
	}
}
