package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"liken.dev/liken/internal/atomicfile"
)

// SetReleasePin writes version → digest into spec.releases of the Cluster in the manifest
// file at path, keeping the file's comments and other documents. The result is checked with
// the API's rules before the file is replaced; nothing is written if it would be invalid.
func SetReleasePin(v *Validator, path, version, digest string) error {
	return PinRelease(v, path, version, digest, false)
}

// PinRelease is SetReleasePin that, with setVersion, also makes version the Cluster's
// spec.version, in the same checked write.
func PinRelease(v *Validator, path, version, digest string, setVersion bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var docs []*yaml.Node
	found := false
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("parsing %s: %w", path, err)
		}
		if isCluster(&n) {
			if found {
				return fmt.Errorf("%s holds more than one Cluster", path)
			}
			found = true
			if err := setPin(&n, version, digest); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if setVersion {
				setScalar(get(mapping(&n), "spec"), "version", version)
			}
			if err := check(v, &n); err != nil {
				return fmt.Errorf("%s: with the new pin the Cluster would be invalid: %w", path, err)
			}
		}
		docs = append(docs, &n)
	}
	if !found {
		return fmt.Errorf("%s holds no Cluster", path)
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	for _, d := range docs {
		if err := enc.Encode(d); err != nil {
			return fmt.Errorf("encoding %s: %w", path, err)
		}
	}
	enc.Close()
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, out.Bytes(), st.Mode().Perm())
}

func mapping(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	return n
}

func get(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func isCluster(n *yaml.Node) bool {
	m := mapping(n)
	if m == nil {
		return false
	}
	k := get(m, "kind")
	return k != nil && k.Value == "Cluster"
}

func setPin(n *yaml.Node, version, digest string) error {
	m := mapping(n)
	spec := get(m, "spec")
	if spec == nil || spec.Kind != yaml.MappingNode {
		return errors.New("the Cluster has no spec")
	}
	rel := get(spec, "releases")
	if rel == nil {
		rel = &yaml.Node{Kind: yaml.MappingNode}
		spec.Content = append(spec.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "releases"}, rel)
	}
	if rel.Kind != yaml.MappingNode {
		return errors.New("spec.releases is not a map")
	}
	rel.Style = 0 // block style, one pin a line
	if cur := get(rel, version); cur != nil {
		cur.Value, cur.Tag, cur.Style = digest, "!!str", 0
		return nil
	}
	rel.Content = append(rel.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Value: version, Tag: "!!str", Style: yaml.DoubleQuotedStyle},
		&yaml.Node{Kind: yaml.ScalarNode, Value: digest, Tag: "!!str"})
	return nil
}

// setScalar sets key to a string value in mapping m, adding it when absent.
func setScalar(m *yaml.Node, key, value string) {
	if cur := get(m, key); cur != nil {
		cur.Kind, cur.Value, cur.Tag, cur.Style, cur.Content = yaml.ScalarNode, value, "!!str", yaml.DoubleQuotedStyle, nil
		return
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Value: value, Tag: "!!str", Style: yaml.DoubleQuotedStyle})
}

func check(v *Validator, n *yaml.Node) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	js, err := sigsyaml.YAMLToJSON(b)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil {
		return err
	}
	if errs := v.Create(u); len(errs) > 0 {
		return errs.ToAggregate()
	}
	return nil
}
