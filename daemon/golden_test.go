package daemon

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/bpf"
)

// The golden scenarios: Kubernetes objects in, `draind bpf dump` of the
// fake datapath out, for a daemon on node node-a (drain Leases in
// namespace draind-system). Each file of testdata/golden is a txtar archive: its
// comment says what the scenario shows, its files are steps run in order:
//
//	-- config --          first step only: "flag value" lines setting the
//	                      daemon's configuration as `draind run` flags do
//	                      (linger, lease-duration, registry-only-policy, …)
//	-- apply --           YAML documents (Service, EndpointSlice, Pod,
//	                      Lease), each created or updated
//	-- delete --          YAML documents naming objects to delete
//	-- advance 30s --     the clock steps (a Go duration)
//	-- offline 10.0.0.1 --  the pod at that IP calls /v1/offline?wait=2m
//	-- dump --            a pass runs; the datapath must print as written
//
// Service-port ids are renumbered in the order the dump shows them (see
// renumber); everything else is printed as the datapath holds it.
//
// go test -run TestGolden ./daemon -update rewrites the dump steps from
// what the daemon writes; read the diff before committing it.

var updateGolden = flag.Bool("update", false, "rewrite the dump steps of testdata/golden from the daemon's output")

// txtarFile is one file of a txtar archive.
type txtarFile struct {
	name string
	data []byte
}

// parseTxtar splits a txtar archive into its comment and files ("-- name --"
// lines start a file).
func parseTxtar(b []byte) (comment []byte, files []txtarFile) {
	lines := strings.SplitAfter(string(b), "\n")
	cur := -1
	for _, l := range lines {
		t := strings.TrimRight(l, "\n")
		if strings.HasPrefix(t, "-- ") && strings.HasSuffix(t, " --") && len(t) > 6 {
			files = append(files, txtarFile{name: strings.TrimSpace(t[3 : len(t)-3])})
			cur++
			continue
		}
		if cur < 0 {
			comment = append(comment, l...)
		} else {
			files[cur].data = append(files[cur].data, l...)
		}
	}
	return comment, files
}

// formatTxtar is parseTxtar's inverse.
func formatTxtar(comment []byte, files []txtarFile) []byte {
	var b bytes.Buffer
	b.Write(comment)
	for _, f := range files {
		fmt.Fprintf(&b, "-- %s --\n", f.name)
		b.Write(f.data)
		if len(f.data) > 0 && !bytes.HasSuffix(f.data, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func TestGolden(t *testing.T) {
	paths, err := filepath.Glob("testdata/golden/*.txtar")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no scenarios in testdata/golden")
	}
	for _, p := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(p), ".txtar"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { runGolden(t, p) })
		})
	}
}

func runGolden(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	comment, files := parseTxtar(b)
	var mods []func(*Config)
	if len(files) > 0 && files[0].name == "config" {
		mods = append(mods, goldenConfig(t, files[0].data))
	}
	h := newHarness(t, mods...)
	dumps := 0
	for i := range files {
		f := &files[i]
		verb, arg, _ := strings.Cut(f.name, " ")
		switch verb {
		case "config":
			if i > 0 {
				t.Fatalf("%s: a config step must come first", path)
			}
		case "apply", "delete":
			for _, doc := range splitYAML(f.data) {
				h.goldenObject(verb, doc)
			}
		case "advance":
			d, err := time.ParseDuration(arg)
			if err != nil {
				t.Fatalf("%s: step %q: %v", path, f.name, err)
			}
			h.clock.Step(d)
		case "offline":
			h.offline(netip.MustParseAddr(arg), 2*time.Minute, 2*time.Second)
		case "dump":
			dumps++
			got := h.goldenDump()
			if *updateGolden {
				f.data = got
				continue
			}
			if !bytes.Equal(got, f.data) {
				t.Errorf("%s: dump %d (step %d):\n--- want\n%s--- got\n%s", path, dumps, i+1, f.data, got)
			}
		default:
			t.Fatalf("%s: unknown step %q (want config, apply, delete, advance D, offline IP or dump)", path, f.name)
		}
	}
	if dumps == 0 {
		t.Fatalf("%s: no dump step: the scenario checks nothing", path)
	}
	if *updateGolden {
		if err := os.WriteFile(path, formatTxtar(comment, files), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// goldenConfig sets what a config step's "flag value" lines say: a
// setting of Config.Settings, or registry-only-policy.
func goldenConfig(t *testing.T, data []byte) func(*Config) {
	return func(c *Config) {
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			flag, val, _ := strings.Cut(strings.TrimSpace(line), " ")
			if err := setGoldenFlag(c, flag, strings.TrimSpace(val)); err != nil {
				t.Fatalf("config %q: %v", line, err)
			}
		}
	}
}

func setGoldenFlag(c *Config, flag, val string) error {
	if flag == "registry-only-policy" {
		p, err := bpf.ParsePolicy(val)
		c.RegistryOnlyPolicy = p
		return err
	}
	for _, s := range c.Settings() {
		if s.Flag != flag {
			continue
		}
		var err error
		if s.Dur != nil {
			*s.Dur, err = time.ParseDuration(val)
		} else {
			*s.Int, err = strconv.Atoi(val)
		}
		return err
	}
	return fmt.Errorf("no setting %q", flag)
}

// goldenDump runs the daemon's rounds (a model pass, a pass over this
// node's drains, the Lease writes they want) until a round writes nothing
// to the datapath, and prints it as `draind bpf dump` does. A pass right
// after a pass, with nothing new in between, must write nothing: a pass
// that a later one corrects unprompted would not show in the dump.
func (h *harness) goldenDump() []byte {
	h.t.Helper()
	for i := 0; ; i++ {
		n := h.pass()
		if ops := h.pass(); ops != 0 {
			h.t.Errorf("a pass right after a pass wrote %d datapath operations", ops)
		}
		h.d.hosted.Reconcile(h.ctx)
		h.d.leaseWriter.Flush(h.ctx)
		h.d.leaseTrust.Flush(h.ctx)
		h.syncLeases()
		if n+h.pass() == 0 {
			break
		}
		if i > 10 {
			h.t.Fatal("rounds keep writing the datapath")
		}
	}
	d, err := h.dp.Dump()
	if err != nil {
		h.t.Fatal(err)
	}
	renumber(d)
	var b bytes.Buffer
	if err := d.WriteText(&b, h.clock.Now()); err != nil {
		h.t.Fatal(err)
	}
	return b.Bytes()
}

// renumber gives d's service-port ids in an order fixed by what the dump
// shows: first the frontends' (in the dump's order), then the drains',
// then the other backend sets' by their backends. The daemon numbers
// service-ports as it activates them, and when several Services activate
// in one pass that order is the order of a map's iteration.
func renumber(d *bpf.Dump) {
	ids := map[bpf.ServicePortID]bpf.ServicePortID{}
	see := func(id bpf.ServicePortID) {
		if _, ok := ids[id]; id != 0 && !ok {
			ids[id] = bpf.ServicePortID(len(ids) + 1)
		}
	}
	for _, f := range d.Frontends {
		see(f.Service)
	}
	for _, dr := range d.Drains {
		see(dr.Service)
	}
	rest := slices.Clone(d.Backends)
	slices.SortStableFunc(rest, func(a, b bpf.Backends) int {
		return strings.Compare(setKey(a.Backends), setKey(b.Backends))
	})
	for _, b := range rest {
		see(b.Service)
	}
	for i := range d.Frontends {
		d.Frontends[i].Service = ids[d.Frontends[i].Service]
	}
	for i := range d.Drains {
		d.Drains[i].Service = ids[d.Drains[i].Service]
	}
	for i := range d.Backends {
		d.Backends[i].Service = ids[d.Backends[i].Service]
	}
	slices.SortFunc(d.Backends, func(a, b bpf.Backends) int { return cmp.Compare(a.Service, b.Service) })
}

// splitYAML splits YAML documents at "---" lines.
func splitYAML(b []byte) [][]byte {
	var out [][]byte
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(doc) != "" {
			out = append(out, []byte(doc))
		}
	}
	return out
}

// goldenObject applies or deletes one YAML document through the fake API
// and waits for the daemon's informer to see it.
func (h *harness) goldenObject(verb string, doc []byte) {
	h.t.Helper()
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		h.t.Fatalf("%v in:\n%s", err, doc)
	}
	decode := func(into any) {
		if err := yaml.UnmarshalStrict(doc, into); err != nil {
			h.t.Fatalf("%s: %v in:\n%s", meta.Kind, err, doc)
		}
	}
	switch meta.Kind {
	case "Service":
		s := &corev1.Service{}
		decode(s)
		h.goldenService(verb, s)
	case "EndpointSlice":
		s := &discoveryv1.EndpointSlice{}
		decode(s)
		if verb == "delete" {
			h.deleteSlice(s.Namespace, s.Name)
		} else {
			h.putSlice(s)
		}
	case "Pod":
		p := &corev1.Pod{}
		decode(p)
		if verb == "delete" {
			h.deletePod(p.Namespace, p.Name)
		} else {
			h.putPod(p)
		}
	case "Lease":
		l := &coordinationv1.Lease{}
		decode(l)
		h.goldenLease(verb, l)
	default:
		h.t.Fatalf("unknown kind %q in:\n%s", meta.Kind, doc)
	}
}

func (h *harness) goldenService(verb string, s *corev1.Service) {
	if verb == "delete" {
		h.deleteService(s.Namespace, s.Name)
		return
	}
	h.do(&h.d.events.services, 1, func(ctx context.Context) error {
		return upsert(ctx, h.client.CoreV1().Services(s.Namespace), s.Name, s)
	})
}

func (h *harness) goldenLease(verb string, l *coordinationv1.Lease) {
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		api := h.client.CoordinationV1().Leases(l.Namespace)
		if verb == "delete" {
			return api.Delete(ctx, l.Name, metav1.DeleteOptions{})
		}
		return upsert(ctx, api, l.Name, l)
	})
}

// objectAPI is the part of a typed client upsert uses.
type objectAPI[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// upsert updates the object named name, or creates it.
func upsert[T any](ctx context.Context, api objectAPI[T], name string, obj T) error {
	if _, err := api.Get(ctx, name, metav1.GetOptions{}); err == nil {
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{})
		return err
	}
	_, err := api.Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// setKey names a backend set by its addresses, each followed by a comma.
func setKey(b []netip.AddrPort) string {
	parts := make([]string, len(b))
	for i, ap := range b {
		parts[i] = ap.String() + ","
	}
	return strings.Join(parts, "")
}
