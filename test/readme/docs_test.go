package readme

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink  = regexp.MustCompile(`\[[^\]\n]*\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*$`)
	slugDel = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// slug is the anchor a heading gets on GitHub: lower case, punctuation
// dropped, spaces turned into dashes.
func slug(h string) string {
	s := slugDel.ReplaceAllString(strings.ToLower(h), "")
	return strings.ReplaceAll(s, " ", "-")
}

// prose returns a Markdown file's text without its fenced code blocks.
func prose(t *testing.T, path string) string {
	t.Helper()
	d, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := d.Text
	for _, b := range d.Blocks {
		out = strings.Replace(out, b.Text, "", 1)
	}
	return out
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	a := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(prose(t, path), -1) {
		a[slug(m[1])] = true
	}
	return a
}

// TestDocLinks: every relative link in the user documentation resolves to
// a file of the repository, and a link to a heading to a heading there.
func TestDocLinks(t *testing.T) {
	files, err := Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		for _, m := range mdLink.FindAllStringSubmatch(prose(t, f), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p, frag, _ := strings.Cut(target, "#")
			dest := f
			if p != "" {
				dest = filepath.Join(filepath.Dir(f), p)
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[frag] {
				t.Errorf("%s: link %s: %s has no heading #%s", f, target, dest, frag)
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Replacing `preStop: sleep 30`":   "replacing-prestop-sleep-30",
		"Trust model: who can cause what": "trust-model-who-can-cause-what",
		"Faults":                          "faults",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// narration matches text that tells how the project was built rather than
// what the code does: work periods, tracker numbers with no tracker to
// follow, a commit as the time something held, and commit hashes used as
// units of time.
var narration = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\b(this|previous|last|earlier|that|next|one|two|three|a few) sessions?\b`),
	regexp.MustCompile(`(?i)\bsessions? (ago|before|earlier)\b`),
	regexp.MustCompile(`(?i)\bissues? #?[0-9]+`),
	regexp.MustCompile(`(?i)\bas of this (commit|change)\b`),
}

// hashSpan is a backquoted hexadecimal word of 7 to 12 characters; with
// both digits and letters in it, a commit hash.
var hashSpan = regexp.MustCompile("`[0-9a-f]{7,12}`")

func narrated(line string) string {
	for _, re := range narration {
		if m := re.FindString(line); m != "" {
			return m
		}
	}
	for _, m := range hashSpan.FindAllString(line, -1) {
		if strings.ContainsAny(m, "0123456789") && strings.ContainsAny(m, "abcdef") {
			return m
		}
	}
	return ""
}

func TestNarrated(t *testing.T) {
	for line, want := range map[string]bool{
		"measured " + "this " + "session":       true,
		"two " + "sessions " + "ago":            true,
		"see " + "issue 12":                     true,
		"pinned " + "as of this " + "commit":    true,
		"at `" + "4c88b06" + "`, p99 0.3 ms":    true,
		"SessionAffinity: ClientIP":             false,
		"sessionAffinity ClientIP":              false,
		"`deadbeef` is not a hash":              false,
		"`1000000` flows":                       false,
		"an issue with the kernel's statistics": false,
	} {
		if got := narrated(line) != ""; got != want {
			t.Errorf("narrated(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestNoHistoryNarration: nothing in the repository's text narrates how it
// was built (see narration). Source, scripts, manifests and docs alike.
func TestNoHistoryNarration(t *testing.T) {
	p, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(p)
	exts := map[string]bool{".go": true, ".md": true, ".sh": true, ".yaml": true, ".yml": true, ".c": true, ".h": true, "": true}
	self, _ := filepath.Abs("docs_test.go")
	n := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") && name != ".ci" || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !exts[filepath.Ext(path)] || !d.Type().IsRegular() || path == self {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.IndexByte(string(b[:min(len(b), 512)]), 0) >= 0 {
			return nil // binary
		}
		n++
		for i, line := range strings.Split(string(b), "\n") {
			if m := narrated(line); m != "" {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %q narrates the project's history: say what and why instead", rel, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("only %d files read: the walk missed the repository", n)
	}
}
