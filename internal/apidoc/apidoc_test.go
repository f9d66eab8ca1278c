package apidoc

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"liken.dev/liken/api/v1alpha1"
)

func TestReferenceUpToDate(t *testing.T) {
	want, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", "docs", "reference", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/reference/api.md is stale: run make generate")
	}
}

// TestReferenceNamesEveryClass checks the document carries the class of every table entry
// and the message of every immutability rule.
func TestReferenceNamesEveryClass(t *testing.T) {
	b, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, fc := range v1alpha1.FieldClasses {
		kind, shown, _ := strings.Cut(fc.Path, ".")
		section := doc[strings.Index(doc, "### "+kind+".spec"):]
		row := "| [`" + shown + "`]"
		i := strings.Index(section, row)
		if i < 0 {
			t.Errorf("no row for %s", fc.Path)
			continue
		}
		line := section[i : i+strings.Index(section[i:], "\n")]
		if !strings.Contains(line, " "+string(fc.Class)) {
			t.Errorf("row for %s does not show class %s: %s", fc.Path, fc.Class, line)
		}
	}
	for _, msg := range []string{"spec.role is immutable", "spec.network is immutable", "must be a MAC address"} {
		if !strings.Contains(doc, msg) {
			t.Errorf("reference lacks the rule %q", msg)
		}
	}
}
