package templatesource

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

var specFiles = field.NewPath("spec", "files")

// errorSummary renders errs as "type field" lines, the part of a field
// error a client acts on.
func errorSummary(errs field.ErrorList) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, fmt.Sprintf("%s %s", string(e.Type), e.Field))
	}
	return out
}

func TestValidateAcceptsTemplateSource(t *testing.T) {
	files := map[string]string{
		"main.tf":                   "variable \"x\" {}\n",
		"README.md":                 "# A template\n",
		"modules/agent/main.tf":     "locals {}\n",
		"scripts/start.sh":          "#!/bin/sh\necho héllo\n",
		"a.tf":                      "",
		strings.Repeat("n", 255):    "ok",
		".terraform.lock.hcl":       "# lock\n",
		"deep/" + "x/y/z/w/file.tf": "",
	}
	if errs := Validate(files, DefaultLimits, specFiles); len(errs) != 0 {
		t.Fatalf("Validate() = %v, want no errors", errs)
	}
	// A zero Limits means the defaults.
	if errs := Validate(files, Limits{}, specFiles); len(errs) != 0 {
		t.Fatalf("Validate(zero limits) = %v, want no errors", errs)
	}
	if errs := Validate(map[string]string{"main.tf.json": "{}"}, DefaultLimits, specFiles); len(errs) != 0 {
		t.Fatalf("Validate(main.tf.json) = %v, want no errors", errs)
	}
}

func TestValidateRejects(t *testing.T) {
	const tf = "main.tf"
	withTF := func(path, content string) map[string]string {
		return map[string]string{tf: "locals {}\n", path: content}
	}
	tests := []struct {
		name   string
		files  map[string]string
		limits Limits
		want   []string
		detail string // in the first error's message
	}{
		{name: "nil map", files: nil,
			want: []string{"FieldValueRequired spec.files"}, detail: "at least one top-level *.tf file"},
		{name: "empty map", files: map[string]string{},
			want: []string{"FieldValueRequired spec.files"}, detail: "at least one top-level *.tf file"},
		{name: "no top-level tf", files: map[string]string{"README.md": "x", "modules/m/main.tf": "", ".hidden.tf": ""},
			want: []string{"FieldValueRequired spec.files"}},
		{name: "absolute path", files: withTF("/etc/passwd", ""),
			want: []string{"FieldValueInvalid spec.files[/etc/passwd]"}, detail: "relative path"},
		{name: "dot-dot segment", files: withTF("../x.tf", ""),
			want: []string{"FieldValueInvalid spec.files[../x.tf]"}, detail: `".." segments`},
		{name: "inner dot-dot", files: withTF("a/../../b", ""),
			want: []string{"FieldValueInvalid spec.files[a/../../b]"}, detail: `".." segments`},
		{name: "dot-dot alone", files: withTF("..", ""),
			want: []string{"FieldValueInvalid spec.files[..]"}},
		{name: "dot prefix", files: withTF("./x.tf", ""),
			want: []string{"FieldValueInvalid spec.files[./x.tf]"}, detail: "clean"},
		{name: "double slash", files: withTF("a//b", ""),
			want: []string{"FieldValueInvalid spec.files[a//b]"}, detail: "clean"},
		{name: "trailing slash", files: withTF("dir/", ""),
			want: []string{"FieldValueInvalid spec.files[dir/]"}, detail: "clean"},
		{name: "dot", files: withTF(".", ""),
			want: []string{"FieldValueInvalid spec.files[.]"}},
		{name: "backslash", files: withTF(`dir\x.tf`, ""),
			want: []string{`FieldValueInvalid spec.files[dir\x.tf]`}, detail: "backslashes"},
		{name: "empty name", files: withTF("", ""),
			want: []string{"FieldValueInvalid spec.files[]"}, detail: "empty"},
		{name: "NUL byte", files: withTF("a\x00b", ""),
			want: []string{"FieldValueInvalid spec.files[a\x00b]"}, detail: "NUL"},
		{name: "segment too long", files: withTF("d/"+strings.Repeat("n", 256), ""),
			want: []string{"FieldValueInvalid spec.files[d/" + strings.Repeat("n", 256) + "]"}, detail: "256 bytes"},
		{name: "path too long", files: withTF(strings.Repeat("abcdefg/", 512)+"x", ""),
			want: []string{"FieldValueInvalid spec.files[" + strings.Repeat("abcdefg/", 512) + "x]"}, detail: "4097 bytes"},
		{name: "file under a file", files: withTF("main.tf/inner", ""),
			want: []string{"FieldValueInvalid spec.files[main.tf/inner]"}, detail: `inside "main.tf"`},
		{name: "non-UTF-8 content", files: withTF("logo.png", "\x89PNG\r\n\x1a\n\xff"),
			want: []string{"FieldValueInvalid spec.files[logo.png]"}, detail: "UTF-8"},
		{name: "file too big", files: withTF("big.txt", strings.Repeat("x", 101)), limits: Limits{MaxFileBytes: 100},
			want: []string{"FieldValueTooLong spec.files[big.txt]"}, detail: "100 bytes"},
		{name: "total too big", files: withTF("b.txt", strings.Repeat("x", 91)), limits: Limits{MaxTotalBytes: 100},
			want: []string{"FieldValueTooLong spec.files"}, detail: "100 bytes"},
		{name: "too many files", files: manyFiles(1001), limits: DefaultLimits,
			want: []string{"FieldValueTooMany spec.files"}, detail: "1001"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := Validate(tt.files, tt.limits, specFiles)
			if got := errorSummary(errs); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Validate() = %q, want %q", got, tt.want)
			}
			if !strings.Contains(errs[0].Error(), tt.detail) {
				t.Errorf("Validate()[0] = %q, want it to mention %q", errs[0].Error(), tt.detail)
			}
			// Archive refuses what Validate rejects, naming the same file.
			_, err := Archive(tt.files, tt.limits)
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("Archive() error = %v, want a *FileError", err)
			}
		})
	}
}

func manyFiles(n int) map[string]string {
	files := map[string]string{"main.tf": ""}
	for i := len(files); i < n; i++ {
		files[fmt.Sprintf("f/%04d.txt", i)] = "x"
	}
	return files
}

func TestValidateReportsEveryProblemInPathOrder(t *testing.T) {
	files := map[string]string{
		"z/../a":   "",
		"/abs":     "",
		"main.tf":  "",
		"m\\n":     "",
		"big.txt":  strings.Repeat("x", 11),
		"bin.dat":  "\xff",
		"ok/fine":  "",
		"zz/./bad": "",
	}
	want := []string{
		"FieldValueInvalid spec.files[/abs]",
		"FieldValueTooLong spec.files[big.txt]",
		"FieldValueInvalid spec.files[bin.dat]",
		`FieldValueInvalid spec.files[m\n]`,
		"FieldValueInvalid spec.files[z/../a]",
		"FieldValueInvalid spec.files[zz/./bad]",
		"FieldValueTooLong spec.files",
	}
	limits := Limits{MaxFileBytes: 10, MaxTotalBytes: 10}
	for i := range 20 { // map iteration order varies from run to run
		got := errorSummary(Validate(files, limits, specFiles))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("run %d: Validate() = %q, want %q", i, got, want)
		}
	}
}

func TestValidateAtTheLimits(t *testing.T) {
	limits := Limits{MaxFiles: 3, MaxFileBytes: 10, MaxTotalBytes: 25}
	files := map[string]string{
		"main.tf": strings.Repeat("a", 10),
		"b.txt":   strings.Repeat("b", 10),
		"c.txt":   strings.Repeat("c", 5),
	}
	if errs := Validate(files, limits, specFiles); len(errs) != 0 {
		t.Fatalf("Validate() at the limits = %v, want no errors", errs)
	}
	if errs := Validate(map[string]string{strings.Repeat("abcdefg/", 511) + "abcde.tf": ""}, DefaultLimits, nil); len(errs) != 1 ||
		errs[0].Type != field.ErrorTypeRequired {
		// A 4096-byte path is fine; only the missing top-level *.tf is reported.
		t.Fatalf("Validate(4096-byte path) = %v, want only the missing *.tf", errs)
	}
}
