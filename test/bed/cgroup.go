package bed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/bpf"
)

// Cgroup is a cgroup v2 directory the bed created.
type Cgroup struct {
	Path string
}

// NewCgroup creates a cgroup under parent (a cgroup v2 path; "" = the root
// of the cgroup2 mount).
func NewCgroup(parent, name string) (*Cgroup, error) {
	if parent == "" {
		root, err := bpf.Cgroup2Mount()
		if err != nil {
			return nil, err
		}
		parent = root
	}
	p := filepath.Join(parent, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", p, err)
	}
	return &Cgroup{Path: p}, nil
}

// Child creates a cgroup below this one.
func (c *Cgroup) Child(name string) (*Cgroup, error) { return NewCgroup(c.Path, name) }

// Open returns a directory handle (for SysProcAttr.CgroupFD).
func (c *Cgroup) Open() (*os.File, error) {
	return os.OpenFile(c.Path, os.O_RDONLY|syscall.O_DIRECTORY, 0)
}

// Remove kills whatever still runs in the cgroup subtree and removes it,
// children first.
func (c *Cgroup) Remove() error {
	var dirs []string
	filepath.WalkDir(c.Path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		errs = append(errs, removeCgroupDir(dirs[i]))
	}
	return errors.Join(errs...)
}

func removeCgroupDir(p string) error {
	// cgroup.kill exists since 5.14; fall back to signalling each process.
	if err := os.WriteFile(filepath.Join(p, "cgroup.kill"), []byte("1"), 0); err != nil {
		if b, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				var pid int
				fmt.Sscan(f, &pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	var err error
	for i := 0; i < 200; i++ {
		if err = os.Remove(p); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // the kernel reaps killed tasks asynchronously
	}
	return fmt.Errorf("removing cgroup %s: %w", p, err)
}
