package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Document is one object read from a manifest file.
type Document struct {
	// Source is "file" or "file#N" for the N-th document (from 1) of a multi-document file.
	Source string
	Object *unstructured.Unstructured
}

// Load reads every object from path: a YAML or JSON file, possibly with several documents
// separated by "---", or a directory whose *.yaml, *.yml and *.json files are read in name
// order (not recursively).
func Load(path string) ([]Document, error) {
	files, err := Files(path)
	if err != nil {
		return nil, err
	}
	var docs []Document
	for _, f := range files {
		d, err := LoadFile(f)
		if err != nil {
			return nil, err
		}
		docs = append(docs, d...)
	}
	return docs, nil
}

// Files lists the manifest files path stands for: itself, or a directory's *.yaml, *.yml
// and *.json files in name order.
func Files(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	var files []string
	for _, e := range entries {
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".yaml", ".yml", ".json":
			if !e.IsDir() {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("reading manifests: no .yaml, .yml or .json file in %s", path)
	}
	return files, nil
}

// LoadFile reads every object in one manifest file.
func LoadFile(name string) ([]Document, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	return Parse(name, b)
}

// Parse reads every object in b, the contents of a manifest called name (a file, or
// standard input).
func Parse(name string, b []byte) ([]Document, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs []Document
	for n := 1; ; n++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			n--
			continue
		}
		// YAML → JSON → unstructured, as kubectl sends it and the API server decodes it
		// (integers stay int64, duplicate keys are refused).
		js, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			return nil, fmt.Errorf("parsing %s document %d: %w", name, n, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("parsing %s document %d: %w", name, n, err)
		}
		docs = append(docs, Document{Source: fmt.Sprintf("%s#%d", name, n), Object: u})
	}
	for i := range docs {
		if len(docs) == 1 {
			docs[i].Source = name
		}
	}
	return docs, nil
}

func stripComments(b []byte) []byte {
	var out [][]byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out = append(out, l)
		}
	}
	return bytes.Join(out, []byte("\n"))
}
