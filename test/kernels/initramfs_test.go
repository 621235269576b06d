package kernels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestModuleOrderDependenciesFirst(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/a/nft_nat.ko.xz: kernel/a/nf_tables.ko.xz kernel/a/nf_nat.ko.xz kernel/a/nf_conntrack.ko.xz\n" +
		"kernel/a/nf_tables.ko.xz: kernel/a/nfnetlink.ko.xz\n" +
		"kernel/a/nfnetlink.ko.xz:\n" +
		"kernel/a/nf_nat.ko.xz: kernel/a/nf_conntrack.ko.xz\n" +
		"kernel/a/nf_conntrack.ko.xz:\n" +
		"kernel/d/veth.ko.xz:\n"
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := moduleOrder(dir, []string{"veth", "nft_nat", "not_a_module", "nf_tables"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, moduleName(p))
	}
	want := "veth nf_conntrack nf_nat nfnetlink nf_tables nft_nat"
	if strings.Join(names, " ") != want {
		t.Errorf("order %v, want %s", names, want)
	}
}
