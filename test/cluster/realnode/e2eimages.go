package realnode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	imageutils "k8s.io/kubernetes/test/utils/image"

	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/e2ebin"
	"github.com/draind/draind/test/cluster/kubebin"
)

// The upstream e2e suite's images, built offline from source and from the
// host's programs, under the names and tags test/utils/image of the
// k8s.io/kubernetes version in go.mod expects (so no spec pulls):
//
//   - agnhost: the module's agnhost (static), porter's TLS files, /uploads,
//     CoreDNS as /coredns (e2ebin.CoreDNS), busybox's applets in /bin (sh,
//     seq, …) and the host's curl, OpenBSD nc, GNU wget, dig and getent
//     with the shared libraries they load;
//   - glibc-dns-testing: busybox's applets, dash as /bin/sh, and the host's
//     dig and getent (glibc's resolver, as the image's name says);
//   - busybox: the host's busybox with its applets (and, if it is not
//     Debian's busybox-static, the shared objects it loads);
//   - pause: agnhost's pause;
//   - nginx: only ever run as a pod that listens (EndpointSlice specs),
//     here agnhost's netexec on port 80;
//   - regression-issue-74839: the module's program of that name.

// E2EImages returns the references BuildE2EImages writes.
func E2EImages() []string {
	return []string{
		imageutils.GetE2EImage(imageutils.Agnhost),
		imageutils.GetE2EImage(imageutils.GlibcDnsTesting),
		imageutils.GetE2EImage(imageutils.BusyBox),
		imageutils.GetPauseImageName(),
		imageutils.GetE2EImage(imageutils.Nginx),
		imageutils.GetE2EImage(imageutils.RegressionIssue74839),
	}
}

// BuildE2EImages writes the e2e suite's images to an OCI archive in dir.
func BuildE2EImages(ctx context.Context, dir string, bins *e2ebin.Set) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	agnhost, err := os.ReadFile(bins.Path(e2ebin.Agnhost))
	if err != nil {
		return "", fmt.Errorf("reading agnhost: %w", err)
	}
	regression, err := os.ReadFile(bins.Path(e2ebin.Regression74839))
	if err != nil {
		return "", fmt.Errorf("reading regression-issue-74839: %w", err)
	}
	coredns, err := os.ReadFile(bins.Path(e2ebin.CoreDNS))
	if err != nil {
		return "", fmt.Errorf("reading coredns: %w", err)
	}
	bb, err := busyboxFiles(ctx)
	if err != nil {
		return "", err
	}
	// curl and OpenBSD's nc, as upstream's image has them (busybox's nc
	// lacks -v, -t, -u, -z, which the specs pass), and GNU wget: Debian's
	// static busybox's wget crashes in an image without glibc's NSS set-up.
	curl, err := hostPrograms(ctx, map[string]string{
		"curl": "/usr/bin/curl", "nc": "/usr/bin/nc", "wget": "/usr/bin/wget", "dash": "/usr/bin/dash"})
	if err != nil {
		return "", err
	}
	// The DNS specs' probes: dig (bind9-dnsutils) and getent.
	dnsTools, err := hostPrograms(ctx, map[string]string{"dig": "/usr/bin/dig", "getent": "/usr/bin/getent", "dash": "/usr/bin/dash"})
	if err != nil {
		return "", err
	}
	porter, err := porterFiles()
	if err != nil {
		return "", err
	}
	agn := append([]image.File{
		{Path: "/agnhost", Mode: 0o755, Data: agnhost},
		{Path: "/agnhost-2", Link: "agnhost"},
		{Path: "/uploads/.keep", Mode: 0o644},
		{Path: "/coredns", Mode: 0o755, Data: coredns},
	}, porter...)
	// /bin/sh is dash: Debian's busybox sh runs its own applets before
	// PATH's programs, so its nc and wget would win.
	sh := []image.File{{Path: "/bin/sh", Link: "/usr/bin/dash"}}
	agn = mergeFiles(agn, sh, bb, curl, dnsTools)
	glibcDNS := mergeFiles(sh, bb, dnsTools)
	specs := map[string]image.Spec{
		imageutils.GetE2EImage(imageutils.Agnhost):              {Files: agn, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		imageutils.GetE2EImage(imageutils.GlibcDnsTesting):      {Files: glibcDNS, Cmd: []string{"sh"}},
		imageutils.GetE2EImage(imageutils.BusyBox):              {Files: bb, Cmd: []string{"sh"}},
		imageutils.GetPauseImageName():                          {Files: agn[:1], Entrypoint: []string{"/agnhost", "pause"}},
		imageutils.GetE2EImage(imageutils.Nginx):                {Files: agn, Entrypoint: []string{"/agnhost", "netexec", "--http-port=80"}},
		imageutils.GetE2EImage(imageutils.RegressionIssue74839): {Files: []image.File{{Path: "/regression-issue-74839", Mode: 0o755, Data: regression}}, Entrypoint: []string{"/regression-issue-74839"}},
	}
	imgs := map[string]v1.Image{}
	for ref, s := range specs {
		if imgs[ref], err = image.Build(s); err != nil {
			return "", fmt.Errorf("building %s: %w", ref, err)
		}
	}
	out := filepath.Join(dir, "e2e-images.tar")
	if err := image.WriteArchive(out, imgs); err != nil {
		return "", err
	}
	return out, nil
}

// busyboxFiles is the host's busybox at /bin/busybox, the shared objects
// it loads (none for busybox-static) and a link in /bin for each of its
// applets.
func busyboxFiles(ctx context.Context) ([]image.File, error) {
	files, err := hostPrograms(ctx, map[string]string{"busybox": "/bin/busybox"})
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, "busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox's applets: %w", err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			files = append(files, image.File{Path: "/bin/" + a, Link: "busybox"})
		}
	}
	return files, nil
}

// hostPrograms are the host's programs (name → path in the image) and
// every shared object ldd says they load, each at its path on the host.
func hostPrograms(ctx context.Context, progs map[string]string) ([]image.File, error) {
	var files []image.File
	for name, dst := range progs {
		path, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("the e2e images need %s (test/deps.sh installs it): %w", name, err)
		}
		libs, err := sharedObjects(ctx, path)
		if err != nil {
			return nil, err
		}
		for i, src := range append([]string{path}, libs...) {
			data, err := os.ReadFile(src)
			if err != nil {
				return nil, err
			}
			if i > 0 {
				dst = filepath.Clean(src)
			}
			files = append(files, image.File{Path: dst, Mode: 0o755, Data: data})
		}
	}
	return mergeFiles(files), nil
}

// mergeFiles drops every file whose path came earlier in the lists.
func mergeFiles(lists ...[]image.File) []image.File {
	var out []image.File
	seen := map[string]bool{}
	for _, l := range lists {
		for _, f := range l {
			if !seen[f.Path] {
				seen[f.Path] = true
				out = append(out, f)
			}
		}
	}
	return out
}

// sharedObjects returns the paths ldd gives for a program's libraries
// and its loader.
func sharedObjects(ctx context.Context, path string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", path).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", path, err)
	}
	var paths []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"; vdso has no path.
		f := strings.Fields(sc.Text())
		if len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/") {
			paths = append(paths, f[2])
		} else if len(f) >= 1 && strings.HasPrefix(f[0], "/") {
			paths = append(paths, f[0])
		}
	}
	return paths, sc.Err()
}

// porterFiles are agnhost porter's TLS certificate and key, read from the
// k8s.io/kubernetes module, at the image's working directory as upstream
// places them.
func porterFiles() ([]image.File, error) {
	mod, err := kubebin.ModuleDir()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", "k8s.io/kubernetes/test/images/agnhost/porter")
	cmd.Dir = mod
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("locating agnhost's porter in the module cache: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	var files []image.File
	for _, n := range []string{"localhost.crt", "localhost.key"} {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		files = append(files, image.File{Path: "/" + n, Mode: 0o644, Data: data})
	}
	return files, nil
}
