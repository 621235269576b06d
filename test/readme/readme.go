// Package readme reads the repository's user documentation (README.md,
// CONTRIBUTING.md and docs/*.md) so that tests run its recipes exactly as
// printed: fenced code blocks, inline code spans, and the preStop command
// of a pod-spec snippet. A recipe that changes in the documentation
// changes in the test; one that disappears fails it. A recipe may move
// between these files: tests look it up in all of them at once.
//
// It is used by both Go modules (the main one and test/cluster).
//
// Words are defined in the repository's docs/glossary.md.
package readme

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/test/srcroot"
)

// Doc is one parsed Markdown file, or several read as one (Load).
type Doc struct {
	Path   string // the (first) file; its directory is the repository root for Load
	Text   string
	Blocks []Block
}

// Block is a fenced code block.
type Block struct {
	Lang string // the info string after the fence ("yaml", "sh", "")
	Text string // the contents, without the fences
	Line int    // 1-based line of the opening fence in File
	File string // the file holding it
}

// Where names the block's file and line for messages.
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Path returns the path of the repository's README.md, at the root of the
// draind module (the tests of both modules run from the repository).
func Path() (string, error) {
	root, err := srcroot.Module("github.com/draind/draind")
	if err != nil {
		return "", fmt.Errorf("locating README.md: %w", err)
	}
	p := filepath.Join(root, "README.md")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("locating README.md: %w", err)
	}
	return p, nil
}

// Files returns the repository's user documentation: README.md first,
// then CONTRIBUTING.md and docs/*.md in name order.
func Files() ([]string, error) {
	p, err := Path()
	if err != nil {
		return nil, err
	}
	root := filepath.Dir(p)
	files := []string{p}
	if c := filepath.Join(root, "CONTRIBUTING.md"); fileExists(c) {
		files = append(files, c)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(docs)
	return append(files, docs...), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Load reads the repository's user documentation (Files) as one Doc:
// a recipe is found wherever it lives. Path is README.md's.
func Load() (*Doc, error) {
	files, err := Files()
	if err != nil {
		return nil, err
	}
	all := &Doc{Path: files[0]}
	for _, f := range files {
		d, err := LoadFile(f)
		if err != nil {
			return nil, err
		}
		all.Text += d.Text + "\n"
		all.Blocks = append(all.Blocks, d.Blocks...)
	}
	return all, nil
}

// LoadFile reads and parses a Markdown file.
func LoadFile(path string) (*Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return Parse(path, string(b))
}

// Parse splits Markdown text into its fenced code blocks (``` fences).
func Parse(path, text string) (*Doc, error) {
	d := &Doc{Path: path, Text: text}
	var cur *Block
	var body []string
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == nil {
			if lang, ok := strings.CutPrefix(trimmed, "```"); ok {
				cur = &Block{Lang: strings.TrimSpace(lang), Line: i + 1, File: path}
				body = nil
			}
			continue
		}
		if trimmed == "```" {
			cur.Text = strings.Join(body, "\n") + "\n"
			d.Blocks = append(d.Blocks, *cur)
			cur = nil
			continue
		}
		body = append(body, line)
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: code block never closed", path, cur.Line)
	}
	return d, nil
}

// Block returns the one fenced block of language lang whose text contains
// every one of marks. None or several is an error: the test must know which
// recipe it runs.
func (d *Doc) Block(lang string, marks ...string) (Block, error) {
	var found []Block
	for _, b := range d.Blocks {
		if b.Lang != lang {
			continue
		}
		all := true
		for _, m := range marks {
			all = all && strings.Contains(b.Text, m)
		}
		if all {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		return Block{}, fmt.Errorf("%s: want exactly one %q block containing %q, found %d", d.Path, lang, marks, len(found))
	}
	return found[0], nil
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

// InlineCode returns the one inline code span (outside fenced blocks) that
// contains every one of marks.
func (d *Doc) InlineCode(marks ...string) (string, error) {
	outside := d.Text
	for _, b := range d.Blocks {
		outside = strings.Replace(outside, b.Text, "", 1)
	}
	var found []string
	for _, m := range inlineCode.FindAllStringSubmatch(outside, -1) {
		all := true
		for _, mk := range marks {
			all = all && strings.Contains(m[1], mk)
		}
		if all {
			found = append(found, m[1])
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s: want exactly one inline code span containing %q, found %d", d.Path, marks, len(found))
	}
	return found[0], nil
}

// PodSpec decodes a README snippet of the form "spec: <pod spec>" strictly
// (a misspelt field is an error, as the API server's strict validation
// would say).
func PodSpec(b Block) (*corev1.PodSpec, error) {
	var doc struct {
		Spec corev1.PodSpec `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(b.Text), &doc); err != nil {
		return nil, fmt.Errorf("%s: decoding the pod spec strictly: %w", b.Where(), err)
	}
	return &doc.Spec, nil
}

// PreStopCommand returns the exec command of the preStop hook of the
// container named container in a "spec:" snippet.
func PreStopCommand(b Block, container string) ([]string, error) {
	spec, err := PodSpec(b)
	if err != nil {
		return nil, err
	}
	for _, c := range spec.Containers {
		if c.Name != container {
			continue
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
			return nil, fmt.Errorf("%s: container %s has no exec preStop hook", b.Where(), container)
		}
		return c.Lifecycle.PreStop.Exec.Command, nil
	}
	return nil, fmt.Errorf("%s: no container %s", b.Where(), container)
}

// CommandLine returns the one command line of an indented code block (four
// spaces, outside fenced blocks) that contains every one of marks, without
// its indentation and trailing comment.
func (d *Doc) CommandLine(marks ...string) (string, error) {
	outside := d.Text
	for _, b := range d.Blocks {
		outside = strings.Replace(outside, b.Text, "", 1)
	}
	var found []string
	for _, line := range strings.Split(outside, "\n") {
		cmd, ok := strings.CutPrefix(line, "    ")
		if !ok || strings.HasPrefix(cmd, " ") {
			continue
		}
		all := true
		for _, m := range marks {
			all = all && strings.Contains(cmd, m)
		}
		if all {
			if i := strings.Index(cmd, "  #"); i >= 0 {
				cmd = cmd[:i]
			}
			found = append(found, strings.TrimSpace(cmd))
		}
	}
	if len(found) != 1 {
		return "", fmt.Errorf("%s: want exactly one command line containing %q, found %d", d.Path, marks, len(found))
	}
	return found[0], nil
}
