package srcroot

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, name, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A module not above this source file is found above the working
// directory, as under -trimpath; the nearest declaring go.mod wins, and a
// nested module does not hide its parent.
func TestModuleAboveWorkingDirectory(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "go.mod"), "// a comment first\nmodule example.com/outer\n\ngo 1.26\n")
	write(t, filepath.Join(root, "inner", "go.mod"), "module \"example.com/outer/inner\"\n")
	deep := filepath.Join(root, "inner", "pkg", "deep")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(deep)
	for path, want := range map[string]string{
		"example.com/outer":       root,
		"example.com/outer/inner": filepath.Join(root, "inner"),
	} {
		got, err := Module(path)
		if err != nil || got != want {
			t.Errorf("Module(%q) = %q, %v; want %q", path, got, err, want)
		}
	}
	if got, err := Module("example.com/outer/pkg"); err == nil {
		t.Errorf("Module of an undeclared path = %q, want an error", got)
	}
}

// This repository's root holds README.md, whichever way it was found.
func TestModuleOfThisRepository(t *testing.T) {
	root, err := Module("github.com/draind/draind")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "README.md")); err != nil {
		t.Errorf("root %s: %v", root, err)
	}
}
