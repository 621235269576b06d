// Package codeshape holds checks over the whole main module's production
// code: every function short enough to read as one decision, every
// package of more than one file mapped file by file in its doc.go, and
// every package comment linking the glossary.
package codeshape

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// maxFunctionLines keeps every production function short enough to read
// as one decision.
const maxFunctionLines = 80

// root is the main module's directory.
const root = "../.."

// productionDirs are the directories of the module's production packages:
// everything but test/ (test beds and their tools), testdata and hidden
// directories.
func productionDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		rel, _ := filepath.Rel(root, p)
		if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || rel == "test") {
			return filepath.SkipDir
		}
		if files := goFiles(t, p); len(files) > 0 {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 8 {
		t.Fatalf("found %d production packages under %s, expected the module's (bpf, cmd/draind, daemon, k8s, ...)", len(dirs), root)
	}
	return dirs
}

// goFiles are a directory's non-test Go files, generated ones excluded.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range sourceFiles(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if !generated.Match(b) {
			out = append(out, n)
		}
	}
	return out
}

// sourceFiles are a directory's non-test Go files, generated ones
// included: what a package's file map names.
func sourceFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, n)
		}
	}
	return out
}

// generated is the marker of generated Go files (go help generate).
var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range productionDirs(t) {
		for _, f := range goFiles(t, dir) {
			path := filepath.Join(dir, f)
			af, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				checked++
				if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFunctionLines {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("%s: %s is %d lines (at most %d): cut it into named steps", rel, fd.Name.Name, n, maxFunctionLines)
				}
			}
		}
	}
	if checked < 500 {
		t.Fatalf("checked %d functions: the walk missed the module's code", checked)
	}
	t.Logf("%d production functions, each at most %d lines", checked, maxFunctionLines)
}

// goFileName is a file name in a package comment's map.
var goFileName = regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)

// packageDocs are the package comments of a directory's non-test Go
// files, by file.
func packageDocs(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	docs := map[string]string{}
	for _, n := range sourceFiles(t, dir) {
		af, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if af.Doc != nil {
			docs[n] = af.Doc.Text()
		}
	}
	return docs
}

// TestDocMapsEveryFile: every package of more than one file has a
// doc.go whose package comment names every file of the package
// (generated ones too) and only files that exist.
func TestDocMapsEveryFile(t *testing.T) {
	mapped := 0
	for _, dir := range productionDirs(t) {
		rel, _ := filepath.Rel(root, dir)
		files := sourceFiles(t, dir)
		if len(files) < 2 {
			continue
		}
		doc, ok := packageDocs(t, dir)["doc.go"]
		if !ok {
			t.Errorf("%s has %d files and no package comment in doc.go: say there what each holds", rel, len(files))
			continue
		}
		mapped++
		named := goFileName.FindAllString(doc, -1)
		for _, f := range files {
			if f != "doc.go" && !slices.Contains(named, f) {
				t.Errorf("%s/doc.go does not say what %s holds", rel, f)
			}
		}
		for _, n := range named {
			if !slices.Contains(files, n) {
				t.Errorf("%s/doc.go names %s, which is not a file of the package", rel, n)
			}
		}
	}
	if mapped < 8 {
		t.Fatalf("%d packages map their files in doc.go: the walk missed the module's packages", mapped)
	}
}

// TestPackageDocLinksGlossary: every package has one package comment (in
// one file), and it points to the glossary.
func TestPackageDocLinksGlossary(t *testing.T) {
	for _, dir := range productionDirs(t) {
		rel, _ := filepath.Rel(root, dir)
		docs := packageDocs(t, dir)
		if len(docs) != 1 {
			t.Errorf("%s: package comments in %d files %v, want one (doc.go where the package has one)", rel, len(docs), slices.Sorted(maps.Keys(docs)))
		}
		for f, doc := range docs {
			if !strings.Contains(doc, "docs/glossary.md") {
				t.Errorf("%s/%s: the package comment does not link docs/glossary.md", rel, f)
			}
		}
	}
}
