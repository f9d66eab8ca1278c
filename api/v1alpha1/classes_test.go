package v1alpha1_test

import (
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/config/crd"
)

// specFields walks the generated CRDs and returns every field under spec, keyed by path
// ("machine.spec.network.interfaces.name"), with its schema and its parent's schema.
func specFields(t *testing.T) map[string]fieldSchema {
	t.Helper()
	crds, err := crd.All()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]fieldSchema{}
	for _, c := range crds {
		root := c.Spec.Versions[0].Schema.OpenAPIV3Schema
		spec := root.Properties["spec"]
		walk(strings.ToLower(c.Spec.Names.Kind)+".spec", &spec, out)
	}
	if len(out) < 50 {
		t.Fatalf("found only %d spec fields in the CRDs; the walk is broken", len(out))
	}
	return out
}

type fieldSchema struct {
	schema, parent *apiextensionsv1.JSONSchemaProps
	name           string
}

func itemsOrSelf(s *apiextensionsv1.JSONSchemaProps) *apiextensionsv1.JSONSchemaProps {
	if s.Items != nil && s.Items.Schema != nil {
		return s.Items.Schema // list items share their list's path
	}
	return s
}

func walk(path string, s *apiextensionsv1.JSONSchemaProps, out map[string]fieldSchema) {
	s = itemsOrSelf(s)
	for name, p := range s.Properties {
		p := p
		child := path + "." + name
		out[child] = fieldSchema{schema: &p, parent: s, name: name}
		walk(child, &p, out)
	}
}

func TestEveryFieldHasOneClass(t *testing.T) {
	fields := specFields(t)
	var paths []string
	for p := range fields {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		// An object whose fields all have classes is only a container of them.
		if len(itemsOrSelf(fields[p].schema).Properties) > 0 {
			continue
		}
		if _, ok := v1alpha1.ClassOf(p); !ok {
			t.Errorf("%s has no change class: add it to FieldClasses in api/v1alpha1/classes.go", p)
		}
	}
	seen := map[string]bool{}
	for _, fc := range v1alpha1.FieldClasses {
		if seen[fc.Path] {
			t.Errorf("%s is in FieldClasses twice", fc.Path)
		}
		seen[fc.Path] = true
		if _, ok := fields[fc.Path]; !ok {
			t.Errorf("FieldClasses names %s, which is not a field of the API", fc.Path)
		}
		switch fc.Class {
		case v1alpha1.Live, v1alpha1.RestartK3s, v1alpha1.NextBoot, v1alpha1.Reboot, v1alpha1.Immutable:
		default:
			t.Errorf("%s has unknown class %q", fc.Path, fc.Class)
		}
		if fc.Why == "" {
			t.Errorf("%s: say why it has class %s", fc.Path, fc.Class)
		}
	}
}

// TestImmutableFieldsHaveRules checks the API side of the table: every Immutable field has a
// transition rule refusing its change, and also its removal or addition (a field's own
// "self == oldSelf" does not run when the field is absent on one side), and no field outside
// the Immutable class refuses change. The API tier proves each rule against the real server.
func TestImmutableFieldsHaveRules(t *testing.T) {
	fields := specFields(t)
	for path, f := range fields {
		fc, _ := v1alpha1.ClassOf(path)
		own := hasRule(f.schema, "self == oldSelf")
		if fc.Path != path {
			if own && fc.Class != v1alpha1.Immutable {
				t.Errorf("%s refuses change in the API but its class is %s", path, fc.Class)
			}
			continue
		}
		if fc.Class != v1alpha1.Immutable {
			if own {
				t.Errorf("%s refuses change in the API but its class is %s", path, fc.Class)
			}
			continue
		}
		if !own {
			t.Errorf("%s is Immutable but its schema has no rule 'self == oldSelf'", path)
		}
		required := false
		for _, r := range f.parent.Required {
			required = required || r == f.name
		}
		presence := hasRule(f.parent, "has(self."+f.name+") == has(oldSelf."+f.name+")") ||
			hasRule(f.parent, "!has(oldSelf."+f.name+") || has(self."+f.name+")")
		if !required && f.schema.Default == nil && !presence {
			t.Errorf("%s is Immutable but may be added or removed: make it required, give it a default, or add a presence rule on its parent", path)
		}
	}
}

func hasRule(s *apiextensionsv1.JSONSchemaProps, rule string) bool {
	for _, r := range s.XValidations {
		if strings.Contains(r.Rule, rule) {
			return true
		}
	}
	return false
}

func TestClassOfUsesDeepestEntry(t *testing.T) {
	tests := []struct {
		path string
		want v1alpha1.ChangeClass
	}{
		{"cluster.spec.features.traefik", v1alpha1.RestartK3s},
		{"cluster.spec.features.serviceLB", v1alpha1.Immutable},
		{"cluster.spec.network.serviceCIDR", v1alpha1.Immutable},
		{"machine.spec.network.interfaces.bond.mode", v1alpha1.Reboot},
		{"machine.spec.nodeLabels", v1alpha1.Live},
		{"machine.spec.kernelModules.parameters", v1alpha1.NextBoot},
	}
	for _, tt := range tests {
		got, ok := v1alpha1.ClassOf(tt.path)
		if !ok || got.Class != tt.want {
			t.Errorf("ClassOf(%s) = %v, %v; want %s", tt.path, got.Class, ok, tt.want)
		}
	}
	if _, ok := v1alpha1.ClassOf("machine.specx"); ok {
		t.Errorf("ClassOf matched a path that is only a string prefix of an entry")
	}
}
