package templatesource

import "testing"

func TestFilesHash(t *testing.T) {
	a := FilesHash(map[string]string{"main.tf": "x", "b/c.tf": "y"})
	if a != FilesHash(map[string]string{"b/c.tf": "y", "main.tf": "x"}) {
		t.Error("the hash depends on map order")
	}
	for _, other := range []map[string]string{
		{"main.tf": "x"},
		{"main.tf": "x", "b/c.tf": "y "},
		{"main.tfb/c.tf": "xy"},
		{"main.tf": "xb/c.tfy"},
		{},
	} {
		if FilesHash(other) == a {
			t.Errorf("%q hashes like the original", other)
		}
	}
	if got := FilesHash(nil); got != FilesHash(map[string]string{}) || len(got) != len("sha256:")+64 {
		t.Errorf("empty source hash %q", got)
	}
}
