// Package crd holds liken's generated CustomResourceDefinitions (made by `make generate`;
// never edit the YAML by hand) so that the CLI, the validator and the tests use the same bytes
// that are installed in a cluster.
package crd

import (
	"embed"
	"fmt"
	"io/fs"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed *.yaml
var files embed.FS

// All returns every CRD, in file-name order.
func All() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		c := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, c); err != nil {
			return nil, fmt.Errorf("reading CRD %s: %w", n, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// Files returns the raw YAML of every CRD by file name.
func Files() (map[string][]byte, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, n := range names {
		b, err := files.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out[n] = b
	}
	return out, nil
}
