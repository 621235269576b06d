// Package files copies directory trees for the beds: the deploy tree a
// test renders from, and the logs a failed bed leaves behind.
package files

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// CopyTree copies the regular files under src into dst, with their
// directories; symlinks and other special files are left out. It goes on
// past a file it cannot copy (a pod's log directory the kubelet removes
// meanwhile): the error names every one.
func CopyTree(dst, src string) error {
	var errs []error
	err := filepath.WalkDir(src, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			errs = append(errs, os.MkdirAll(filepath.Join(dst, rel), 0o755))
		case e.Type().IsRegular():
			errs = append(errs, CopyFile(filepath.Join(dst, rel), p))
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// CopyFile copies the file src to dst, creating or truncating dst.
func CopyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
