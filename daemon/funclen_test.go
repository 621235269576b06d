package daemon

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFunctionLines keeps every production function of the package short
// enough to read as one decision.
const maxFunctionLines = 80

func TestFunctionLength(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
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
				t.Errorf("%s: %s is %d lines (at most %d): cut it into named steps", f, fd.Name.Name, n, maxFunctionLines)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d functions found: is the test running in the package directory?", checked)
	}
}
