package deploycheck

import (
	"bufio"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/test/cluster/draindbin"
)

// dockerfileBuild returns the shell command of the Dockerfile's RUN step
// that builds draind (line continuations joined, RUN options such as
// --mount dropped) and the path it writes the binary to.
func dockerfileBuild(path string) (cmd, out string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", fmt.Errorf("opening Dockerfile: %w", err)
	}
	defer f.Close()
	var steps []string
	var cur strings.Builder
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasPrefix(line, "#") { // comment inside a continued step
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		steps = append(steps, cur.String())
		cur.Reset()
	}
	if err := s.Err(); err != nil {
		return "", "", fmt.Errorf("reading Dockerfile: %w", err)
	}
	var builds []string
	for _, st := range steps {
		rest, ok := strings.CutPrefix(st, "RUN ")
		if !ok || !strings.Contains(rest, "go build") {
			continue
		}
		fields := strings.Fields(rest)
		for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
			fields = fields[1:]
		}
		builds = append(builds, strings.Join(fields, " "))
	}
	if len(builds) != 1 {
		return "", "", fmt.Errorf("want one RUN step with go build in the Dockerfile, found %d", len(builds))
	}
	m := regexp.MustCompile(`\s-o\s+(\S+)`).FindStringSubmatch(builds[0])
	if m == nil {
		return "", "", fmt.Errorf("the Dockerfile's go build has no -o: %s", builds[0])
	}
	return builds[0], m[1], nil
}

// TestStaticBuild runs the Dockerfile's go build step (the image cannot be
// built here: no Docker engine) with the build arguments filled in, and
// checks that the binary is static (no program interpreter, no dynamic
// section: it runs on distroless/static), carries the version given as a
// build argument, and that the DaemonSet only uses flags and DRAIND_*
// variables `draind run` documents, with the ports it listens on.
func TestStaticBuild(t *testing.T) {
	root, err := draindbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmdline, out, err := dockerfileBuild(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cmdline, "CGO_ENABLED=0") {
		t.Errorf("the Dockerfile builds with cgo possible: %s", cmdline)
	}
	bin := filepath.Join(t.TempDir(), "draind")
	cmdline = strings.Replace(cmdline, out, bin, 1)
	const version = "v0.0.0-deploycheck"
	cmd := exec.Command("sh", "-c", cmdline)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TARGETOS=linux", "TARGETARCH="+runtime.GOARCH, "VERSION="+version)
	t.Logf("building as the Dockerfile does: %s", cmdline)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build step failed: %v\n%s", err, b)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a program interpreter (dynamically linked)")
		}
		if p.Type == elf.PT_DYNAMIC {
			t.Error("the binary has a dynamic segment")
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		t.Error("the binary has a .dynamic section")
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary has a symbol table: -s was not applied")
	}

	run := func(args ...string) string {
		t.Helper()
		b, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("draind %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	if v := run("version"); !strings.HasPrefix(v, "draind "+version) {
		t.Errorf("draind version = %q, want the VERSION build argument %s", v, version)
	}

	// The DaemonSet against the binary it runs.
	help := run("run", "--help")
	flags := map[string]string{} // flag -> env
	defaults := map[string]string{}
	// "  --offline-addr string   listen address ... (env DRAIND_OFFLINE_ADDR) (default ":9460")"
	re := regexp.MustCompile(`^\s+--([a-z0-9-]+)\s.*\(env (DRAIND_[A-Z0-9_]+)\)(?:\s+\(default "?([^")]*)"?\))?\s*$`)
	for _, line := range strings.Split(help, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			flags[m[1]] = m[2]
			defaults[m[1]] = m[3]
		}
	}
	if len(flags) < 10 {
		t.Fatalf("read %d flags from draind run --help: the help format changed?\n%s", len(flags), help)
	}
	envs := map[string]string{}
	for f, e := range flags {
		envs[e] = f
	}

	objs := typed(t, rendered(t))
	c := only[*appsv1.DaemonSet](t, objs, "draind").Spec.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("container args %v do not start with run", c.Args)
	}
	set := map[string]string{} // flag -> value as the container sets it
	for _, a := range c.Args[1:] {
		name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || flags[name] == "" {
			t.Errorf("container argument %q is not a flag of draind run", a)
			continue
		}
		set[name] = val
	}
	for _, e := range c.Env {
		if !strings.HasPrefix(e.Name, "DRAIND_") {
			continue
		}
		f, ok := envs[e.Name]
		if !ok {
			t.Errorf("container env %s is not a documented fallback of draind run", e.Name)
			continue
		}
		if _, dup := set[f]; dup {
			t.Errorf("--%s is set both as an argument and as %s", f, e.Name)
		}
		set[f] = e.Value
		if e.ValueFrom != nil {
			set[f] = "<from " + e.ValueFrom.FieldRef.FieldPath + ">"
		}
	}
	if set["node-name"] != "<from spec.nodeName>" {
		t.Errorf("--node-name is %q, want it from the downward API spec.nodeName", set["node-name"])
	}
	if set["namespace"] != "<from metadata.namespace>" {
		t.Errorf("--namespace is %q, want it from the pod's namespace", set["namespace"])
	}
	if set["log-format"] != "json" {
		t.Errorf("--log-format is %q, want json", set["log-format"])
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for flag, portName := range map[string]string{"offline-addr": "offline", "metrics-addr": "metrics"} {
		addr, ok := set[flag]
		if !ok {
			addr = defaults[flag]
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("--%s=%q: %v", flag, addr, err)
			continue
		}
		if n, _ := strconv.Atoi(p); int32(n) != ports[portName] || n == 0 {
			t.Errorf("draind listens on %s (--%s) but the container port %q is %d", p, flag, portName, ports[portName])
		}
	}
	if c.LivenessProbe.HTTPGet.Port.String() != "offline" || c.ReadinessProbe.HTTPGet.Port.String() != "offline" {
		t.Errorf("probes must target the offline port, where /healthz and /readyz are served")
	}
	// The pin directory must be on the bpffs volume.
	pin := set["bpffs-dir"]
	if pin == "" {
		pin = defaults["bpffs-dir"]
	}
	onBPFFS := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "bpffs" && strings.HasPrefix(pin, strings.TrimSuffix(m.MountPath, "/")+"/")
	})
	if !onBPFFS {
		t.Errorf("--bpffs-dir %s is not below the bpffs volume's mount", pin)
	}
	// And the status socket on the /run/draind volume, where draind status
	// (through kubectl exec) looks by default.
	sock := set["status-socket"]
	if sock == "" {
		sock = defaults["status-socket"]
	}
	if filepath.Dir(sock) != "/run/draind" {
		t.Errorf("status socket %s is not in /run/draind", sock)
	}
}
