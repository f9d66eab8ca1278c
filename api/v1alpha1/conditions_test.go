package v1alpha1

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestConditionReasonsDeclaredAndDocumented reads the source of every package that sets
// conditions and finds each condition type and reason it can set, following the reason from
// the metav1.Condition literal back through helper parameters, local variables, function
// results and the Reason fields of the structs that carry one (a failed trial's reason goes
// through FailedArgs and FailedRelease before it reaches a condition). It fails when a reason
// set is not a constant of this file's reasons, when a declared reason is never set, when a
// condition and reason set have no row in docs/troubleshoot.md, and when a row there names
// one the code never sets. What it cannot follow fails too, so a new way of setting a reason
// is looked at instead of slipping through.
func TestConditionReasonsDeclaredAndDocumented(t *testing.T) {
	root := filepath.Join("..", "..")
	types, reasons := declaredConditions(t, "conditions.go")

	src := newSource(t, root, []string{"api", "cmd", "internal"})
	set := map[string]map[string]bool{} // "Machine/Ready" -> reasons
	for _, c := range src.conditionLiterals() {
		for _, tuple := range src.resolve(c.file, []ast.Expr{c.typ, c.reason}) {
			typ, reason := tuple[0], tuple[1]
			kind, ok := types[typ.name]
			if !ok {
				src.fail(typ.at, "condition type %s is not a Machine or Cluster condition type of conditions.go", typ)
				continue
			}
			if _, ok := reasons[reason.value]; !ok {
				src.fail(reason.at, "reason %s is set on %s but not declared in conditions.go", reason, kind)
				continue
			}
			if set[kind] == nil {
				set[kind] = map[string]bool{}
			}
			set[kind][reason.value] = true
		}
	}
	for _, e := range src.errs {
		t.Error(e)
	}
	if len(set) == 0 {
		t.Fatal("found no condition set in the source: the search is broken")
	}

	used := map[string]bool{}
	for _, rs := range set {
		for r := range rs {
			used[r] = true
		}
	}
	for value, name := range reasons {
		if !used[value] {
			t.Errorf("%s (%q) is declared but no condition is ever set with it: set it or remove it", name, value)
		}
	}

	doc, err := os.ReadFile(filepath.Join(root, "docs", "troubleshoot.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := documentedReasons(t, string(doc))
	for kind, rs := range set {
		for r := range rs {
			if !documented[kind][r] {
				t.Errorf("docs/troubleshoot.md has no row for the %s condition %s with reason %s", strings.Split(kind, "/")[0], strings.Split(kind, "/")[1], r)
			}
		}
	}
	for kind, rs := range documented {
		for r := range rs {
			if !set[kind][r] {
				t.Errorf("docs/troubleshoot.md documents the %s condition with reason %s, which the code never sets", kind, r)
			}
		}
	}
}

// declaredConditions reads the condition types (constant name -> "Machine/Ready") and the
// reasons (value -> constant name) declared in file.
func declaredConditions(t *testing.T, file string) (map[string]string, map[string]string) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	types, reasons := map[string]string{}, map[string]string{}
	for name, value := range constants(f) {
		switch {
		case strings.HasPrefix(name, "Reason"):
			if other, ok := reasons[value]; ok {
				t.Errorf("%s and %s are both %q", other, name, value)
			}
			reasons[value] = name
		case strings.HasPrefix(name, "Machine"):
			types[name] = "Machine/" + value
		case strings.HasPrefix(name, "Cluster"):
			types[name] = "Cluster/" + value
		default:
			t.Errorf("conditions.go declares %s, neither a condition type (Machine..., Cluster...) nor a reason (Reason...)", name)
		}
	}
	if len(types) == 0 || len(reasons) == 0 {
		t.Fatal("conditions.go declares no condition types or no reasons")
	}
	return types, reasons
}

func constants(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					out[n.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
	}
	return out
}

// documentedReasons reads the tables under "## Machine conditions" and "## Cluster
// conditions": each row names one or more condition types in its first cell and one or more
// reasons in its second, each in backquotes, and documents every pair of them.
func documentedReasons(t *testing.T, doc string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	quoted := regexp.MustCompile("`([A-Za-z0-9]+)`")
	for _, kind := range []string{"Machine", "Cluster"} {
		heading := "\n## " + kind + " conditions\n"
		i := strings.Index(doc, heading)
		if i < 0 {
			t.Errorf("docs/troubleshoot.md has no section %q", strings.TrimSpace(heading))
			continue
		}
		section := doc[i+len(heading):]
		if j := strings.Index(section, "\n## "); j >= 0 {
			section = section[:j]
		}
		for _, line := range strings.Split(section, "\n") {
			cells := strings.Split(line, "|")
			if !strings.HasPrefix(line, "|") || len(cells) < 4 {
				continue
			}
			for _, typ := range quoted.FindAllStringSubmatch(cells[1], -1) {
				for _, reason := range quoted.FindAllStringSubmatch(cells[2], -1) {
					key := kind + "/" + typ[1]
					if out[key] == nil {
						out[key] = map[string]bool{}
					}
					out[key][reason[1]] = true
				}
			}
		}
	}
	return out
}

// constant is what an expression in the source was resolved to: a string constant's name
// (empty for a literal) and value, and where the source gives it.
type constant struct {
	name, value string
	at          ast.Node
}

func (c constant) String() string {
	if c.name == "" {
		return strconv.Quote(c.value)
	}
	return fmt.Sprintf("%s (%q)", c.name, c.value)
}

// source is the parsed non-test Go files of the module's packages, with what resolving an
// expression needs: where each function's parameters are, and each file's package.
type source struct {
	fset  *token.FileSet
	files []*ast.File
	dir   map[*ast.File]string
	// params maps a parameter's field to its function (a *ast.FuncDecl or *ast.FuncLit) and
	// the position of its first name among the parameters.
	params map[*ast.Field]paramOf
	// funcVar maps a function literal assigned to a variable to that variable.
	funcVar map[*ast.FuncLit]*ast.Object
	// consts holds every package-level string constant, by package directory and name.
	consts map[string]map[string]string
	errs   []string
	seen   map[ast.Node]bool
}

type paramOf struct {
	fn    ast.Node
	index int
}

func newSource(t *testing.T, root string, dirs []string) *source {
	s := &source{fset: token.NewFileSet(), dir: map[*ast.File]string{}, params: map[*ast.Field]paramOf{},
		funcVar: map[*ast.FuncLit]*ast.Object{}, consts: map[string]map[string]string{}, seen: map[ast.Node]bool{}}
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(s.fset, path, nil, 0)
			if err != nil {
				return err
			}
			s.files = append(s.files, f)
			s.dir[f] = filepath.Dir(path)
			if s.consts[filepath.Dir(path)] == nil {
				s.consts[filepath.Dir(path)] = map[string]string{}
			}
			for n, v := range constants(f) {
				s.consts[filepath.Dir(path)][n] = v
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range s.files {
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			switch n := n.(type) {
			case *ast.FuncDecl:
				ft = n.Type
			case *ast.FuncLit:
				ft = n.Type
			case *ast.AssignStmt:
				for i, r := range n.Rhs {
					if fl, ok := r.(*ast.FuncLit); ok && len(n.Lhs) == len(n.Rhs) {
						if id, ok := n.Lhs[i].(*ast.Ident); ok && id.Obj != nil {
							s.funcVar[fl] = id.Obj
						}
					}
				}
			}
			if ft != nil {
				i := 0
				for _, p := range ft.Params.List {
					s.params[p] = paramOf{n, i}
					i += max(1, len(p.Names))
				}
			}
			return true
		})
	}
	return s
}

func (s *source) fail(at ast.Node, format string, args ...any) {
	s.errs = append(s.errs, s.fset.Position(at.Pos()).String()+": "+fmt.Sprintf(format, args...))
}

type conditionLiteral struct {
	file        *ast.File
	typ, reason ast.Expr
}

// conditionLiterals finds every metav1.Condition literal.
func (s *source) conditionLiterals() []conditionLiteral {
	var out []conditionLiteral
	for _, f := range s.files {
		ast.Inspect(f, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok || typeName(cl.Type) != "Condition" || !isPkg(cl.Type, "metav1") {
				return true
			}
			c := conditionLiteral{file: f}
			for _, e := range cl.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					switch kv.Key.(*ast.Ident).Name {
					case "Type":
						c.typ = kv.Value
					case "Reason":
						c.reason = kv.Value
					}
				}
			}
			if c.typ == nil || c.reason == nil {
				s.fail(cl, "a condition without a type or a reason")
				return true
			}
			out = append(out, c)
			return true
		})
	}
	return out
}

// resolve gives every combination of constants the expressions (in file f) can take. When
// they are all parameters of one function, they are resolved together at each call, so a
// helper called with (type, reason) pairs yields those pairs and no others.
func (s *source) resolve(f *ast.File, exprs []ast.Expr) [][]constant {
	if fn, idx, ok := s.sameFuncParams(exprs); ok {
		var out [][]constant
		for _, call := range s.callsOf(f, fn) {
			args := make([]ast.Expr, len(idx))
			for i, j := range idx {
				if j >= len(call.expr.Args) {
					s.fail(call.expr, "too few arguments to follow")
					return nil
				}
				args[i] = call.expr.Args[j]
			}
			out = append(out, s.resolve(call.file, args)...)
		}
		return out
	}
	out := [][]constant{nil}
	for _, e := range exprs {
		var next [][]constant
		for _, c := range s.resolveOne(f, e) {
			for _, prefix := range out {
				next = append(next, append(append([]constant(nil), prefix...), c))
			}
		}
		out = next
	}
	return out
}

// sameFuncParams says whether every expression is a parameter of one function, and where.
func (s *source) sameFuncParams(exprs []ast.Expr) (ast.Node, []int, bool) {
	var fn ast.Node
	var idx []int
	for _, e := range exprs {
		p, i, ok := s.param(e)
		if !ok || (fn != nil && p != fn) {
			return nil, nil, false
		}
		fn = p
		idx = append(idx, i)
	}
	return fn, idx, fn != nil
}

func (s *source) param(e ast.Expr) (ast.Node, int, bool) {
	id, ok := e.(*ast.Ident)
	if !ok || id.Obj == nil {
		return nil, 0, false
	}
	field, ok := id.Obj.Decl.(*ast.Field)
	if !ok {
		return nil, 0, false
	}
	p, ok := s.params[field]
	if !ok {
		return nil, 0, false
	}
	for i, n := range field.Names {
		if n.Name == id.Name {
			return p.fn, p.index + i, true
		}
	}
	return nil, 0, false
}

type call struct {
	file *ast.File
	expr *ast.CallExpr
}

// callsOf finds the calls of fn: of a function literal through the variable it is assigned
// to (in its own file), of a declared function or method by its name in its package.
func (s *source) callsOf(f *ast.File, fn ast.Node) []call {
	var out []call
	switch fn := fn.(type) {
	case *ast.FuncLit:
		obj := s.funcVar[fn]
		if obj == nil {
			s.fail(fn, "a function literal not assigned to a variable: cannot find its calls")
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if id, ok := c.Fun.(*ast.Ident); ok && id.Obj == obj {
					out = append(out, call{f, c})
				}
			}
			return true
		})
	case *ast.FuncDecl:
		for _, g := range s.files {
			if s.dir[g] != s.dir[f] {
				continue
			}
			ast.Inspect(g, func(n ast.Node) bool {
				c, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				switch fun := c.Fun.(type) {
				case *ast.Ident:
					if fn.Recv == nil && fun.Name == fn.Name.Name {
						out = append(out, call{g, c})
					}
				case *ast.SelectorExpr:
					if fn.Recv != nil && fun.Sel.Name == fn.Name.Name {
						out = append(out, call{g, c})
					}
				}
				return true
			})
		}
	}
	if len(out) == 0 {
		s.fail(fn, "no call of this function found")
	}
	return out
}

// resolveOne gives every constant e (in file f) can be.
func (s *source) resolveOne(f *ast.File, e ast.Expr) []constant {
	if s.seen[e] {
		return nil // a cycle: what it adds is found on the other path
	}
	s.seen[e] = true
	defer delete(s.seen, e)
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			v, _ := strconv.Unquote(e.Value)
			return []constant{{"", v, e}}
		}
	case *ast.ParenExpr:
		return s.resolveOne(f, e.X)
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok && pkg.Obj == nil {
			if v, ok := s.packageConst(f, pkg.Name, e.Sel.Name); ok {
				return []constant{{e.Sel.Name, v, e}}
			}
			s.fail(e, "%s.%s is not a string constant found in the source", pkg.Name, e.Sel.Name)
			return nil
		}
		if e.Sel.Name == "Reason" {
			return s.reasonField(f, e)
		}
	case *ast.Ident:
		if e.Obj == nil {
			if v, ok := s.consts[s.dir[f]][e.Name]; ok {
				return []constant{{e.Name, v, e}}
			}
			break
		}
		if _, _, ok := s.param(e); ok {
			var out []constant
			for _, tuple := range s.resolve(f, []ast.Expr{e}) {
				out = append(out, tuple[0])
			}
			return out
		}
		if e.Obj.Kind == ast.Con {
			if v, ok := s.consts[s.dir[f]][e.Name]; ok {
				return []constant{{e.Name, v, e}}
			}
		}
		if e.Obj.Kind == ast.Var {
			return s.assignedTo(f, e.Obj)
		}
	}
	s.fail(e, "cannot tell which reasons %s can be", s.text(e))
	return nil
}

// packageConst finds the constant name of the package imported as pkg in f.
func (s *source) packageConst(f *ast.File, pkg, name string) (string, bool) {
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		local := filepath.Base(path)
		if imp.Name != nil {
			local = imp.Name.Name
		}
		if local != pkg {
			continue
		}
		for dir, consts := range s.consts {
			if strings.HasSuffix(filepath.ToSlash(dir), strings.TrimPrefix(path, "liken.dev/liken")) {
				v, ok := consts[name]
				return v, ok
			}
		}
	}
	return "", false
}

// assignedTo gives every constant assigned to the local variable obj in f.
func (s *source) assignedTo(f *ast.File, obj *ast.Object) []constant {
	var out []constant
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			for i, l := range n.Lhs {
				if id, ok := l.(*ast.Ident); !ok || id.Obj != obj {
					continue
				}
				found = true
				if len(n.Rhs) == len(n.Lhs) {
					out = append(out, s.resolveOne(f, n.Rhs[i])...)
				} else if c, ok := n.Rhs[0].(*ast.CallExpr); ok && len(n.Rhs) == 1 {
					out = append(out, s.result(f, c, i)...)
				} else {
					s.fail(n, "cannot follow this assignment")
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				if id.Obj == obj && i < len(n.Values) {
					found = true
					out = append(out, s.resolveOne(f, n.Values[i])...)
				}
			}
		}
		return true
	})
	if !found {
		s.fail(obj.Decl.(ast.Node), "no assignment to %s found", obj.Name)
	}
	return out
}

// result gives every constant the function c calls returns as its result i.
func (s *source) result(f *ast.File, c *ast.CallExpr, i int) []constant {
	id, ok := c.Fun.(*ast.Ident)
	if !ok {
		s.fail(c, "cannot follow a call of %s", s.text(c.Fun))
		return nil
	}
	var out []constant
	found := false
	for _, g := range s.files {
		if s.dir[g] != s.dir[f] {
			continue
		}
		for _, d := range g.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || fd.Name.Name != id.Name || fd.Body == nil {
				continue
			}
			found = true
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.FuncLit:
					return false // its returns are not fd's
				case *ast.ReturnStmt:
					if len(n.Results) <= i {
						s.fail(n, "a bare return: cannot tell what %s returns", fd.Name.Name)
						return false
					}
					out = append(out, s.resolveOne(g, n.Results[i])...)
				}
				return true
			})
		}
	}
	if !found {
		s.fail(c, "no declaration of %s found", id.Name)
	}
	return out
}

// reasonField resolves x.Reason through every literal of x's struct type that sets its
// Reason: the structs that carry a reason to a condition are made whole by a literal.
func (s *source) reasonField(f *ast.File, e *ast.SelectorExpr) []constant {
	typ := s.typeOf(f, e.X)
	if typ == "" {
		s.fail(e, "cannot tell the type of %s", s.text(e.X))
		return nil
	}
	var out []constant
	found := false
	for _, g := range s.files {
		ast.Inspect(g, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if typeName(n.Type) != typ {
					return true
				}
				elts := n.Elts
				if _, ok := n.Type.(*ast.ArrayType); ok {
					// []T{{Reason: ...}}: the elements' type is elided.
					elts = nil
					for _, el := range n.Elts {
						if inner, ok := el.(*ast.CompositeLit); ok && inner.Type == nil {
							elts = append(elts, inner.Elts...)
						}
					}
				}
				for _, el := range elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok && kv.Key.(*ast.Ident).Name == "Reason" {
						found = true
						out = append(out, s.resolveOne(g, kv.Value)...)
					}
				}
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && sel.Sel.Name == "Reason" && s.typeOf(g, sel.X) == typ {
						s.fail(n, "%s.Reason is assigned outside a literal: cannot follow it", typ)
					}
				}
			}
			return true
		})
	}
	if !found {
		s.fail(e, "no %s literal sets Reason", typ)
	}
	return out
}

// typeOf gives the name of e's struct type, without package or pointer, where the source
// says it plainly: a parameter's or a field's declared type, or the value a variable is
// given; "" otherwise.
func (s *source) typeOf(f *ast.File, e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		if e.Obj == nil {
			return ""
		}
		switch d := e.Obj.Decl.(type) {
		case *ast.Field:
			return typeName(d.Type)
		case *ast.AssignStmt:
			if len(d.Lhs) != len(d.Rhs) {
				return ""
			}
			for i, l := range d.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Obj == e.Obj {
					return s.typeOf(f, d.Rhs[i])
				}
			}
		}
	case *ast.UnaryExpr:
		return s.typeOf(f, e.X)
	case *ast.CompositeLit:
		return typeName(e.Type)
	case *ast.SelectorExpr:
		// A field: its type where every struct in the source with a field of that name
		// agrees on it.
		var typ string
		ok := true
		for _, g := range s.files {
			ast.Inspect(g, func(n ast.Node) bool {
				st, isStruct := n.(*ast.StructType)
				if !isStruct {
					return true
				}
				for _, fl := range st.Fields.List {
					for _, name := range fl.Names {
						if name.Name == e.Sel.Name {
							if typ != "" && typ != typeName(fl.Type) {
								ok = false
							}
							typ = typeName(fl.Type)
						}
					}
				}
				return true
			})
		}
		if ok {
			return typ
		}
	}
	return ""
}

// typeName is a type expression's name without its package, pointer or slice.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.ArrayType:
		return typeName(e.Elt)
	}
	return ""
}

func isPkg(e ast.Expr, pkg string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

func (s *source) text(e ast.Expr) string {
	p := s.fset.Position(e.Pos())
	b, err := os.ReadFile(p.Filename)
	if err != nil {
		return "?"
	}
	end := s.fset.Position(e.End()).Offset
	return string(b[p.Offset:end])
}

// TestReasonSearchFollowsHelpers checks the search on a small source of its own, where each
// way a reason reaches a condition is used once and an undeclared one is set: the main test
// passing means nothing if the search finds nothing.
func TestReasonSearchFollowsHelpers(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "internal", "x")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	code := `package x

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

const local = "Local"

type Failed struct{ Reason string }

type input struct{ failed *Failed }

func why(n int) (string, string) {
	if n > 0 {
		return "FromResult", "m"
	}
	return local, "m"
}

func conds(in input, n int) []metav1.Condition {
	var out []metav1.Condition
	add := func(t, reason string) {
		out = append(out, metav1.Condition{Type: t, Reason: reason})
	}
	add("A", "Lit")
	reason, _ := why(n)
	add("B", reason)
	if f := in.failed; f != nil {
		add("C", f.Reason)
	}
	_ = Failed{Reason: "Carried"}
	return out
}
`
	if err := os.WriteFile(filepath.Join(pkg, "x.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSource(t, dir, []string{"internal"})
	var got []string
	for _, c := range s.conditionLiterals() {
		for _, tuple := range s.resolve(c.file, []ast.Expr{c.typ, c.reason}) {
			got = append(got, tuple[0].value+"/"+tuple[1].value)
		}
	}
	if len(s.errs) > 0 {
		t.Fatal(s.errs)
	}
	sort.Strings(got)
	want := "A/Lit B/FromResult B/Local C/Carried"
	if strings.Join(got, " ") != want {
		t.Errorf("found %v, want %s", got, want)
	}
}

// TestReasonSearchFailsWhatItCannotFollow checks that a reason computed in a way the search
// does not follow is an error, not a reason left out.
func TestReasonSearchFailsWhatItCannotFollow(t *testing.T) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "internal", "x")
	if err := os.MkdirAll(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	code := `package x

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func cond(s string) metav1.Condition {
	return metav1.Condition{Type: "A", Reason: strings.ToUpper(s)}
}
`
	if err := os.WriteFile(filepath.Join(pkg, "x.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newSource(t, dir, []string{"internal"})
	for _, c := range s.conditionLiterals() {
		s.resolve(c.file, []ast.Expr{c.typ, c.reason})
	}
	if len(s.errs) != 1 || !strings.Contains(s.errs[0], "cannot tell which reasons strings.ToUpper(s) can be") {
		t.Errorf("errors %q, want one saying strings.ToUpper(s) cannot be followed", s.errs)
	}
}
