package bed

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// NewBPFFS mounts a private bpf filesystem (each mount is its own instance)
// so a test's pins never meet another's or a real draind's.
func NewBPFFS() (dir string, unmount func() error, err error) {
	dir, err = os.MkdirTemp("", "draind-bpffs-")
	if err != nil {
		return "", nil, err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("mounting bpffs on %s: %w", dir, err)
	}
	return dir, func() error {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
		return os.Remove(dir)
	}, nil
}
