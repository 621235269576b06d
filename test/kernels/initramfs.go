// Package kernels boots Debian's own kernels under qemu with draind's
// root-only tests inside (TestKernelMatrix): the datapath is tested on
// every kernel family the project supports, not only the build machine's.
//
// Words are defined in the repository's docs/glossary.md.
package kernels

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// cpioWriter writes a gzip-compressed cpio archive in the "newc" format the
// kernel unpacks as its initramfs.
type cpioWriter struct {
	gz  *gzip.Writer
	ino uint32
	err error
}

func newCPIO(w io.Writer) *cpioWriter {
	gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	return &cpioWriter{gz: gz, ino: 1}
}

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr + name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.gz.Write(b)
	}
}

func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) dir(name string) { c.entry(name, 0o040755, 0, 0, nil) }

func (c *cpioWriter) file(name string, mode uint32, data []byte) {
	c.entry(name, 0o100000|mode, 0, 0, data)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		return c.err
	}
	return c.gz.Close()
}

// image is what one virtual machine's initramfs holds.
type image struct {
	init    string            // the static init binary
	tests   map[string]string // name in /tests -> host path
	runList string            // /tests/run.list
	modules []string          // host paths of module files, in load order
	// files are further host files by their path in the image (a host
	// binary and the shared libraries it needs, at their own paths).
	files map[string]string
}

// topDirs are the image's own directories.
var topDirs = []string{"dev", "tests", "modules", "bin", "proc", "sys", "tmp", "run"}

// writeInitramfs writes img as a compressed initramfs to path.
func writeInitramfs(path string, img image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	c := newCPIO(f)
	for _, d := range topDirs {
		c.dir(d)
	}
	// The kernel opens /dev/console for init's standard streams before
	// init runs: the node must be in the archive.
	c.entry("dev/console", 0o020600, 5, 1, nil)
	add := func(name, src string, mode uint32) {
		b, err := os.ReadFile(src)
		if err != nil && c.err == nil {
			c.err = err
		}
		c.file(name, mode, b)
	}
	add("init", img.init, 0o755)
	for name, src := range img.tests {
		add("tests/"+name, src, 0o755)
	}
	c.file("tests/run.list", 0o644, []byte(img.runList))
	var list []string
	for _, m := range img.modules {
		name := "modules/" + filepath.Base(m)
		add(name, m, 0o644)
		list = append(list, "/"+name)
	}
	c.file("modules.list", 0o644, []byte(strings.Join(list, "\n")+"\n"))
	made := map[string]bool{}
	for _, d := range topDirs {
		made[d] = true
	}
	dirs := map[string]bool{}
	for name := range img.files {
		for d := filepath.Dir(strings.TrimPrefix(name, "/")); d != "." && !made[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range sortedNames(dirs) {
		c.dir(d)
	}
	for _, name := range sortedNames(img.files) {
		add(strings.TrimPrefix(name, "/"), img.files[name], 0o755)
	}
	return c.close()
}

// sortedNames returns the keys of m sorted: a parent directory comes
// before what it holds.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// withLibraries adds the host binary at src to files as dst, and the
// shared libraries it loads (as ldd lists them) at their own paths.
func withLibraries(files map[string]string, dst, src string) error {
	files[dst] = src
	out, err := exec.Command("ldd", src).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", src, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			files[f[2]] = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			files[f[0]] = f[0]
		}
	}
	return nil
}

// moduleOrder resolves the wanted modules (by name, as modprobe takes
// them) against modules.dep in dir, dependencies first. A module built into
// the kernel, or absent from it, is left out.
func moduleOrder(dir string, wanted []string) ([]string, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	deps := map[string][]string{} // module name -> [its path, its deps' paths...]
	byPath := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name := moduleName(mod)
		deps[name] = append([]string{mod}, strings.Fields(rest)...)
		byPath[mod] = name
	}
	var out []string
	seen := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		d, ok := deps[name]
		if !ok || seen[name] {
			return
		}
		seen[name] = true
		// modules.dep lists a module's dependencies with the ones they
		// need after them: load from the end.
		for i := len(d) - 1; i >= 1; i-- {
			visit(byPath[d[i]])
		}
		out = append(out, filepath.Join(dir, d[0]))
	}
	for _, w := range wanted {
		visit(w)
	}
	return out, sc.Err()
}

func moduleName(path string) string {
	b := filepath.Base(path)
	b, _, _ = strings.Cut(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}
