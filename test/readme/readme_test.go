package readme

import (
	"slices"
	"strings"
	"testing"
)

func TestParseAndFind(t *testing.T) {
	md := "intro `draind status` and `wget -q x`\n\n```yaml\nspec:\n  containers:\n  - name: app\n    lifecycle:\n      preStop:\n        exec:\n          command: [sh, -c, \"echo hi\"]\n```\n\n```sh\necho `not inline`\n```\n"
	d, err := Parse("t.md", md)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Blocks) != 2 || d.Blocks[0].Lang != "yaml" || d.Blocks[0].Line != 3 {
		t.Fatalf("blocks %+v", d.Blocks)
	}
	b, err := d.Block("yaml", "preStop")
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := PreStopCommand(b, "app")
	if err != nil || !slices.Equal(cmd, []string{"sh", "-c", "echo hi"}) {
		t.Errorf("preStop %q, %v", cmd, err)
	}
	if _, err := PreStopCommand(b, "other"); err == nil {
		t.Error("a missing container was found")
	}
	if s, err := d.InlineCode("wget"); err != nil || s != "wget -q x" {
		t.Errorf("inline %q, %v", s, err)
	}
	if _, err := d.InlineCode("not inline"); err == nil {
		t.Error("code inside a fenced block counted as inline")
	}
	if _, err := d.Block("yaml", "nothing like this"); err == nil {
		t.Error("a missing block was found")
	}
	if _, err := Parse("t.md", "```\nopen"); err == nil {
		t.Error("an unclosed block parsed")
	}
	bad, _ := Parse("t.md", "```yaml\nspec:\n  containerz: []\n```\n")
	if _, err := PodSpec(bad.Blocks[0]); err == nil || !strings.Contains(err.Error(), "containerz") {
		t.Errorf("a misspelt field decoded: %v", err)
	}
}

// TestRepositoryREADME: the repository's README parses, and the recipes
// the other tests run are there exactly once.
func TestRepositoryREADME(t *testing.T) {
	d, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Block("yaml", "curl", "preStop")
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := PreStopCommand(b, "app")
	if err != nil {
		t.Fatal(err)
	}
	if len(cmd) != 3 || cmd[0] != "sh" || cmd[1] != "-c" || !strings.Contains(cmd[2], "curl") {
		t.Errorf("curl recipe command %q", cmd)
	}
	if _, err := d.InlineCode("wget", "/v1/offline"); err != nil {
		t.Error(err)
	}
}
