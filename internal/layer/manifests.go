package layer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
)

// DecodeCluster decodes a layer's Cluster manifest, strictly: one document, of kind Cluster
// in liken.dev/v1alpha1, with no unknown field. liken layer wrote it so; anything else was
// made by hand or damaged, and is refused rather than half read. Install and init both read
// a layer's manifests through here, so they refuse the same things with the same words.
func DecodeCluster(b []byte) (*v1alpha1.Cluster, error) {
	c := &v1alpha1.Cluster{}
	if err := decodeOne(ClusterManifest, b, "Cluster", c); err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeMachine decodes one of a layer's Machine manifests, as strictly as DecodeCluster.
func DecodeMachine(name string, b []byte) (*v1alpha1.Machine, error) {
	m := &v1alpha1.Machine{}
	if err := decodeOne(name, b, "Machine", m); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeOne(name string, b []byte, kind string, into any) error {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("the layer's %s: %w", name, err)
		}
		if len(bytes.TrimSpace(d)) > 0 && string(bytes.TrimSpace(d)) != "---" {
			docs = append(docs, d)
		}
	}
	var found []TypeMeta
	for _, d := range docs {
		var tm TypeMeta
		if err := yaml.Unmarshal(d, &tm); err != nil {
			return fmt.Errorf("the layer's %s: %w", name, err)
		}
		found = append(found, tm)
	}
	if err := CheckOne("the layer's "+name, kind, found); err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(docs[0], into); err != nil {
		return fmt.Errorf("the layer's %s: %w", name, err)
	}
	return nil
}

// TypeMeta is a document's apiVersion and kind.
type TypeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// CheckOne checks that what (a file, named as the message should name it) holds exactly
// one document, a liken.dev/v1alpha1 object of kind: liken layer, install and init all
// refuse a file that does not with these words.
func CheckOne(what, kind string, docs []TypeMeta) error {
	if len(docs) != 1 {
		return fmt.Errorf("%s holds %d documents; it must hold exactly one %s", what, len(docs), kind)
	}
	if tm := docs[0]; tm.APIVersion != v1alpha1.GroupVersion.String() || tm.Kind != kind {
		return fmt.Errorf("%s is a %s %q, not a %s %q", what, orNone(tm.APIVersion), tm.Kind, v1alpha1.GroupVersion.String(), kind)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(no apiVersion)"
	}
	return s
}

// ReadManifests reads the Cluster and the Machines (sorted by name) from a layer unpacked
// into dir. liken layer checked them with the API's rules and stored them with defaults
// applied; readers only decode them (strictly: DecodeCluster, DecodeMachine), so init
// carries none of the API server's validation code.
func ReadManifests(dir string) (*v1alpha1.Cluster, []*v1alpha1.Machine, error) {
	b, err := os.ReadFile(filepath.Join(dir, ClusterManifest))
	if err != nil {
		return nil, nil, err
	}
	cluster, err := DecodeCluster(b)
	if err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, MachinesDir))
	if err != nil {
		return nil, nil, err
	}
	var machines []*v1alpha1.Machine
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, MachinesDir, e.Name()))
		if err != nil {
			return nil, nil, err
		}
		m, err := DecodeMachine(MachinesDir+"/"+e.Name(), b)
		if err != nil {
			return nil, nil, err
		}
		machines = append(machines, m)
	}
	sort.Slice(machines, func(i, j int) bool { return machines[i].Name < machines[j].Name })
	return cluster, machines, nil
}
