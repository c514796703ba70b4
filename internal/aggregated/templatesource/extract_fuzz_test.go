package templatesource

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzLimits are small so that fuzzed archives reach every limit.
var fuzzLimits = Limits{MaxFiles: 20, MaxFileBytes: 4096, MaxTotalBytes: 16384}

// Template archives come from coderd, which stores whatever was uploaded.
// Extract never panics, allocates in proportion to its limits and input
// (not to what an archive claims or inflates to), refuses with a
// *FileError and nothing else, and what it accepts respects every limit,
// passes the same rules as spec.files and, with its Terraform file,
// archives and extracts back to itself.
//
// The hostile seeds (bombs, traversal, links, huge counts, nesting) are
// committed under testdata/fuzz/FuzzExtract; TestExtractFuzzSeeds says
// what each one must give.
func FuzzExtract(f *testing.F) {
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
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		files, err := Extract(data, fuzzLimits)
		runtime.ReadMemStats(&after)
		// Inflate and read buffers per entry, the kept files, and the
		// parsed headers of the input; a 16 MiB bomb seed would exceed it.
		if allocated, bound := after.TotalAlloc-before.TotalAlloc, uint64(8<<20+16*len(data)); allocated > bound {
			t.Fatalf("Extract allocated %d bytes for %d bytes of input, more than %d", allocated, len(data), bound)
		}
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || fe.Reason == "" {
				t.Fatalf("error %v (%T) is not a *FileError with a reason", err, err)
			}
			if files != nil {
				t.Fatalf("files %q returned with error %v", files, err)
			}
			return
		}
		checkExtracted(t, files)
	})
}

// checkExtracted fails unless files is a source Extract may accept.
func checkExtracted(t *testing.T, files map[string]string) {
	t.Helper()
	if len(files) > fuzzLimits.MaxFiles {
		t.Fatalf("%d files, limit %d", len(files), fuzzLimits.MaxFiles)
	}
	var total int64
	for p, content := range files {
		if reason := pathProblem(p); reason != "" {
			t.Fatalf("unsafe path %q: %s", p, reason)
		}
		if int64(len(content)) > fuzzLimits.MaxFileBytes {
			t.Fatalf("%s: %d bytes, limit %d", p, len(content), fuzzLimits.MaxFileBytes)
		}
		if !utf8.ValidString(content) {
			t.Fatalf("%s: not UTF-8", p)
		}
		total += int64(len(content))
	}
	if total > fuzzLimits.MaxTotalBytes {
		t.Fatalf("%d bytes in total, limit %d", total, fuzzLimits.MaxTotalBytes)
	}
	// The rules spec.files follows, bar the Terraform file an archive in
	// coderd may lack.
	hasTerraform := true
	for _, p := range check(files, fuzzLimits) {
		if p.kind != missingTerraform {
			t.Fatalf("extracted files break a spec.files rule: %s: %s", p.path, p.reason)
		}
		hasTerraform = false
	}
	if !hasTerraform {
		return
	}
	// What a GET shows, an update can send back unchanged.
	tarball, err := Archive(files, fuzzLimits)
	if err != nil {
		t.Fatalf("extracted files do not archive: %v", err)
	}
	again, err := Extract(tarball, fuzzLimits)
	if err != nil || !maps.Equal(again, files) {
		t.Fatalf("archived files extract as %q, %v; want %q", again, err, files)
	}
}

var updateFuzzSeeds = flag.Bool("update-fuzz-seeds", false, "rewrite testdata/fuzz/FuzzExtract from extractSeeds")

const extractSeedDir = "testdata/fuzz/FuzzExtract"

// TestExtractFuzzSeeds checks that the committed seeds are the ones
// extractSeeds builds (go test ./internal/aggregated/templatesource
// -run TestExtractFuzzSeeds -update-fuzz-seeds rewrites them) and that each
// gives its expected result under fuzzLimits.
func TestExtractFuzzSeeds(t *testing.T) {
	seeds := extractSeeds(t)
	if *updateFuzzSeeds {
		if err := os.MkdirAll(extractSeedDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			if err := os.WriteFile(filepath.Join(extractSeedDir, s.name), encodeSeed(s.data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, s := range seeds {
		t.Run(s.name, func(t *testing.T) {
			committed, err := os.ReadFile(filepath.Join(extractSeedDir, s.name))
			if err != nil || !bytes.Equal(committed, encodeSeed(s.data)) {
				t.Errorf("%s/%s is missing or stale (%v): run go test ./internal/aggregated/templatesource -run TestExtractFuzzSeeds -update-fuzz-seeds",
					extractSeedDir, s.name, err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			files, err := Extract(s.data, fuzzLimits)
			runtime.ReadMemStats(&after)
			if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 8<<20 {
				t.Errorf("Extract allocated %d bytes for a %d-byte archive, want under 8 MiB", allocated, len(s.data))
			}
			if s.files != nil {
				if err != nil || !maps.Equal(files, s.files) {
					t.Fatalf("Extract = %q, %v; want %q", files, err, s.files)
				}
				checkExtracted(t, files)
				return
			}
			var fe *FileError
			if !errors.As(err, &fe) || fe.Path != s.path || !strings.Contains(fe.Reason, s.reason) {
				t.Fatalf("Extract = %q, %v; want a *FileError for %q mentioning %q", files, err, s.path, s.reason)
			}
		})
	}
	entries, err := os.ReadDir(extractSeedDir)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range seeds {
		known[s.name] = true
	}
	for _, e := range entries {
		if !known[e.Name()] {
			// A crasher go test -fuzz saved: keep it, and give it an
			// expectation in extractSeeds once fixed.
			t.Logf("%s/%s is not one of extractSeeds (a saved fuzz failure?)", extractSeedDir, e.Name())
		}
	}
}

// encodeSeed is the corpus file format of go test -fuzz for one []byte.
func encodeSeed(data []byte) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", data)
}

type extractSeed struct {
	name string
	data []byte
	// files is what Extract must return; when nil, it must fail with a
	// *FileError for path whose reason contains reason.
	files        map[string]string
	path, reason string
}

// extractSeeds builds archives a hostile or careless uploader could store
// in coderd, each with what Extract must make of it under fuzzLimits.
func extractSeeds(t *testing.T) []extractSeed {
	const bombSize = 16 << 20 // inflated; about 16 KiB deflated
	bomb, bombCRC := deflatedZeros(t, bombSize)
	rawBomb := func(name string, declared uint64) zipEntry {
		return zipEntry{raw: bomb, hdr: zip.FileHeader{Name: name, Method: zip.Deflate, CRC32: bombCRC,
			CompressedSize64: uint64(len(bomb)), UncompressedSize64: declared}}
	}
	link := func(typ byte, name, target string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: typ, Name: name, Linkname: target, Mode: 0o777}}
	}
	dir := func(name string) tarEntry {
		return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
	}
	zipSymlink := zipEntry{hdr: zip.FileHeader{Name: "main.tf"}, body: "/etc/passwd"}
	zipSymlink.hdr.SetMode(fs.ModeSymlink | 0o777)
	tarN, zipN := func(n int) []byte {
		es := make([]tarEntry, n)
		for i := range es {
			es[i] = reg(fmt.Sprintf("f%02d.tf", i), "")
		}
		return buildTar(t, es...)
	}, func(n int) []byte {
		es := make([]zipEntry, n)
		for i := range es {
			es[i] = zipFile(fmt.Sprintf("f%02d.tf", i), "")
		}
		return buildZip(t, es...)
	}
	fourK := strings.Repeat("a", 4096)
	inner := buildTar(t, reg("main.tf", "locals {}\n"))
	deep := strings.Repeat("d/", 2040) + "f.tf"
	tooDeep := strings.Repeat("d/", 2048) + "f.tf"

	return []extractSeed{
		// Accepted.
		{name: "tar-ok", data: buildTar(t, dir("./"), reg("./main.tf", "locals {}\n"), dir("./sub/"), reg("./sub/a.txt", "ünï\n")),
			files: map[string]string{"main.tf": "locals {}\n", "sub/a.txt": "ünï\n"}},
		{name: "zip-ok", data: buildZip(t, zipFile("main.tf", "locals {}\n"), zipFile("sub/", ""), zipFile("sub/a.txt", "a")),
			files: map[string]string{"main.tf": "locals {}\n", "sub/a.txt": "a"}},
		{name: "tar-at-every-limit", data: buildTar(t, reg("a.tf", fourK), reg("b", fourK), reg("c", fourK), reg("d", fourK[:4095]),
			reg("e0", ""), reg("e1", ""), reg("e2", ""), reg("e3", ""), reg("e4", ""), reg("e5", ""), reg("e6", ""), reg("e7", ""),
			reg("e8", ""), reg("e9", ""), reg("ea", ""), reg("eb", ""), reg("ec", ""), reg("ed", ""), reg("ee", ""), reg("x", "y")),
			files: map[string]string{"a.tf": fourK, "b": fourK, "c": fourK, "d": fourK[:4095], "e0": "", "e1": "", "e2": "", "e3": "",
				"e4": "", "e5": "", "e6": "", "e7": "", "e8": "", "e9": "", "ea": "", "eb": "", "ec": "", "ed": "", "ee": "", "x": "y"}},
		// Nested archives are files like any other: never unpacked.
		{name: "tar-in-tar", data: buildTar(t, reg("main.tf", ""), reg("nested.tar", string(inner))),
			files: map[string]string{"main.tf": "", "nested.tar": string(inner)}},
		{name: "tar-deep-directories", data: buildTar(t, reg("main.tf", ""), reg(deep, "x")),
			files: map[string]string{"main.tf": "", deep: "x"}},

		// Bombs: huge declared or actual sizes, refused without inflating.
		{name: "zip-bomb-honest-size", data: buildZip(t, zipFile("main.tf", ""), rawBomb("bomb.tf", bombSize)),
			path: "bomb.tf", reason: "declares 16777216 bytes"},
		{name: "zip-bomb-lying-size", data: buildZip(t, rawBomb("bomb.tf", 100)),
			path: "bomb.tf", reason: "larger than its header declares"},
		{name: "zip-bomb-lying-at-limit", data: buildZip(t, rawBomb("bomb.tf", 4096)),
			path: "bomb.tf", reason: "larger than its header declares"},
		{name: "zip-bomb-huge-declared", data: buildZip(t, rawBomb("bomb.tf", 1<<63)),
			path: "bomb.tf", reason: "declares 9223372036854775808 bytes"},
		{name: "zip-overlapping-entries", data: overlappingZip(t, strings.Repeat("a", 4000), 20),
			path: "f04.tf", reason: "brings the total to more than the limit of 16384 bytes"},
		{name: "zip-entry-count-lie", data: zipCountLie(t),
			path: "", reason: "read zip archive"},
		{name: "tar-huge-declared-size", data: tarHeaderOnly(t, "huge.tf", 1<<40),
			path: "huge.tf", reason: "declares 1099511627776 bytes"},
		{name: "tar-truncated-entry", data: buildTar(t, reg("main.tf", "locals {}\n"))[:512+5],
			path: "main.tf", reason: "read: unexpected EOF"},
		{name: "tar-gnu-sparse-huge", data: gnuSparseTar(t, "sparse.tf"),
			path: "sparse.tf", reason: "tar entry of type 'S'"},
		{name: "tar-pax-sparse-huge", data: paxSparseTar(t, "sparse.tf"),
			path: "sparse.tf", reason: "declares 1099511627776 bytes"},
		{name: "gzip-bomb", data: gzipZeros(t, bombSize),
			path: "", reason: "read tar archive"},
		{name: "tar-total-over-limit", data: buildTar(t, reg("a", fourK), reg("b", fourK), reg("c", fourK), reg("d", fourK), reg("e", "x")),
			path: "e", reason: "brings the total to more than the limit of 16384 bytes"},

		// Huge file counts.
		{name: "tar-too-many-files", data: tarN(21), path: "f20.tf", reason: "beyond the limit of 20 files"},
		{name: "zip-too-many-files", data: zipN(21), path: "f20.tf", reason: "beyond the limit of 20 files"},
		{name: "tar-too-deep", data: buildTar(t, reg("main.tf", ""), reg(tooDeep, "x")),
			path: tooDeep, reason: "more than 4096"},

		// Traversal, absolute paths and links.
		{name: "tar-dotdot", data: buildTar(t, reg("main.tf", ""), reg("../../etc/cron.d/x", "evil")),
			path: "../../etc/cron.d/x", reason: `".." segments`},
		{name: "tar-dotdot-pax-path", data: buildTar(t, reg("../"+strings.Repeat("n", 200)+".tf", "evil")),
			path: "../" + strings.Repeat("n", 200) + ".tf", reason: `".." segments`},
		{name: "tar-dotdot-directory", data: buildTar(t, dir("../up/")), path: "../up/", reason: `".." segments`},
		{name: "tar-absolute", data: buildTar(t, reg("/etc/passwd", "evil")), path: "/etc/passwd", reason: "absolute"},
		{name: "tar-backslash", data: buildTar(t, reg(`..\..\x`, "evil")), path: `..\..\x`, reason: "backslashes"},
		{name: "tar-symlink-then-file", data: buildTar(t, link(tar.TypeSymlink, "d", "/etc"), reg("d/passwd", "evil")),
			path: "d", reason: "symbolic link"},
		{name: "tar-hard-link", data: buildTar(t, reg("a", "x"), link(tar.TypeLink, "b", "/etc/shadow")), path: "b", reason: "hard link"},
		{name: "zip-dotdot", data: buildZip(t, zipFile("../../x.tf", "evil")), path: "../../x.tf", reason: `".." segments`},
		{name: "zip-absolute", data: buildZip(t, zipFile("/tmp/x.tf", "evil")), path: "/tmp/x.tf", reason: "absolute"},
		{name: "zip-symlink", data: buildZip(t, zipSymlink), path: "main.tf", reason: "symbolic link"},
		{name: "zip-nul-in-name", data: buildZip(t, zipFile("a\x00.tf", "x")), path: "a\x00.tf", reason: "NUL"},
	}
}

// overlappingZip is the overlapping-entries zip bomb: one stored entry
// that n central directory records (f00.tf, f01.tf, ...) all point at.
func overlappingZip(t *testing.T, content string, n int) []byte {
	t.Helper()
	le := binary.LittleEndian
	crc := crc32.ChecksumIEEE([]byte(content))
	var b []byte
	// Local file header, stored (method 0).
	b = le.AppendUint32(b, 0x04034b50)
	b = le.AppendUint16(b, 20)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint16(b, 0)
	b = le.AppendUint32(b, 0) // time, date
	b = le.AppendUint32(b, crc)
	b = le.AppendUint32(b, uint32(len(content)))
	b = le.AppendUint32(b, uint32(len(content)))
	b = le.AppendUint16(b, 6)
	b = le.AppendUint16(b, 0)
	b = append(b, "f00.tf"...)
	b = append(b, content...)
	cdStart := len(b)
	for i := range n {
		name := fmt.Sprintf("f%02d.tf", i)
		b = le.AppendUint32(b, 0x02014b50)
		b = le.AppendUint16(b, 20)
		b = le.AppendUint16(b, 20)
		b = le.AppendUint16(b, 0)
		b = le.AppendUint16(b, 0)
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, crc)
		b = le.AppendUint32(b, uint32(len(content)))
		b = le.AppendUint32(b, uint32(len(content)))
		b = le.AppendUint16(b, uint16(len(name)))
		b = le.AppendUint16(b, 0) // extra
		b = le.AppendUint16(b, 0) // comment
		b = le.AppendUint16(b, 0) // disk
		b = le.AppendUint16(b, 0) // internal attributes
		b = le.AppendUint32(b, 0) // external attributes
		b = le.AppendUint32(b, 0) // every entry at offset 0
		b = append(b, name...)
	}
	b = appendEOCD(b, n, len(b)-cdStart, cdStart)
	return b
}

func appendEOCD(b []byte, entries, cdSize, cdOffset int) []byte {
	le := binary.LittleEndian
	b = le.AppendUint32(b, 0x06054b50)
	b = le.AppendUint32(b, 0) // disk numbers
	b = le.AppendUint16(b, uint16(entries))
	b = le.AppendUint16(b, uint16(entries))
	b = le.AppendUint32(b, uint32(cdSize))
	b = le.AppendUint32(b, uint32(cdOffset))
	return le.AppendUint16(b, 0)
}

// zipCountLie is a one-entry zip whose end record claims 65535 entries.
func zipCountLie(t *testing.T) []byte {
	t.Helper()
	b := buildZip(t, zipFile("main.tf", "locals {}\n"))
	eocd := len(b) - 22
	binary.LittleEndian.PutUint16(b[eocd+8:], 0xffff)
	binary.LittleEndian.PutUint16(b[eocd+10:], 0xffff)
	return b
}

// tarHeaderOnly is a tar entry that declares size bytes and holds a few.
func tarHeaderOnly(t *testing.T, name string, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err == nil {
		t.Fatal("Flush succeeded with the entry's content missing")
	}
	return append(buf.Bytes(), make([]byte, 512)...)
}

// tarBlock is a hand-made ustar header block; edit may set more fields
// before the checksum is computed. tar.Writer refuses to write the
// sparse formats below.
func tarBlock(name string, typ byte, size int64, edit func(h []byte)) []byte {
	h := make([]byte, 512)
	copy(h[0:], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], fmt.Sprintf("%011o\x00", size))
	copy(h[136:], "00000000000\x00")
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	if edit != nil {
		edit(h)
	}
	copy(h[148:], "        ")
	var sum int64
	for _, c := range h {
		sum += int64(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

// tarData pads content to whole blocks.
func tarData(content string) []byte {
	return append([]byte(content), make([]byte, (512-len(content)%512)%512)...)
}

// gnuSparseTar is an old-GNU-format sparse entry ('S') whose real size is
// 8 GiB of holes around 512 stored bytes.
func gnuSparseTar(t *testing.T, name string) []byte {
	t.Helper()
	h := tarBlock(name, 'S', 512, func(h []byte) {
		copy(h[257:], "ustar  \x00")
		copy(h[386:], "00000000000\x00") // sparse[0].offset
		copy(h[398:], "00000001000\x00") // sparse[0].numbytes
		copy(h[483:], "77777777777\x00") // realsize
	})
	out := append(h, tarData(strings.Repeat("a", 512))...)
	return append(out, make([]byte, 1024)...)
}

// paxSparseTar is a PAX-format (GNU 1.0) sparse entry whose real size is
// 1 TiB of holes around one stored byte.
func paxSparseTar(t *testing.T, name string) []byte {
	t.Helper()
	record := func(k, v string) string {
		// "<length> <key>=<value>\n", where the length counts itself.
		body := " " + k + "=" + v + "\n"
		n := len(body) + 1
		for len(fmt.Sprint(n))+len(body) != n {
			n++
		}
		return fmt.Sprint(n) + body
	}
	pax := record("GNU.sparse.major", "1") + record("GNU.sparse.minor", "0") +
		record("GNU.sparse.name", name) + record("GNU.sparse.realsize", "1099511627776")
	// The sparse map (one 1-byte region at offset 0) in its own block,
	// then the stored data.
	data := string(tarData("1\n0\n1\n")) + "a"
	out := append(tarBlock("PaxHeaders/sparse", tar.TypeXHeader, int64(len(pax)), nil), tarData(pax)...)
	out = append(out, tarBlock("GNUSparseFile.0/"+name, tar.TypeReg, int64(len(data)), nil)...)
	out = append(out, tarData(data)...)
	return append(out, make([]byte, 1024)...)
}

func gzipZeros(t *testing.T, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for left := n; left > 0; left -= len(zeros) {
		_, _ = zw.Write(zeros[:min(left, len(zeros))])
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
