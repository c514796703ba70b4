package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The committed reference must match the configuration type.
func TestReferenceIsCurrent(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ref.md")
	if err := run("../../internal/config/types.go", out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../docs/config-reference.md")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("docs/config-reference.md is out of date: run `make generate` and commit it")
	}
}
