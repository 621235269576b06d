// Package readme reads the repository's README.md so that tests run its
// recipes exactly as printed: fenced code blocks, inline code spans, and the
// preStop command of a pod-spec snippet. A recipe that changes in the README
// changes in the test; one that disappears fails it.
//
// It is used by both Go modules (the main one and test/cluster).
package readme

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Doc is a parsed Markdown file.
type Doc struct {
	Path   string
	Text   string
	Blocks []Block
}

// Block is a fenced code block.
type Block struct {
	Lang string // the info string after the fence ("yaml", "sh", "")
	Text string // the contents, without the fences
	Line int    // 1-based line of the opening fence
}

// Path returns the path of the repository's README.md, located from this
// source file (the tests of both modules run from the repository).
func Path() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("locating README.md: no caller information")
	}
	p := filepath.Join(filepath.Dir(file), "..", "..", "README.md")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("locating README.md: %w", err)
	}
	return p, nil
}

// Load reads the repository's README.md.
func Load() (*Doc, error) {
	p, err := Path()
	if err != nil {
		return nil, err
	}
	return LoadFile(p)
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
				cur = &Block{Lang: strings.TrimSpace(lang), Line: i + 1}
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
		return nil, fmt.Errorf("README line %d: decoding the pod spec strictly: %w", b.Line, err)
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
			return nil, fmt.Errorf("README line %d: container %s has no exec preStop hook", b.Line, container)
		}
		return c.Lifecycle.PreStop.Exec.Command, nil
	}
	return nil, fmt.Errorf("README line %d: no container %s", b.Line, container)
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
