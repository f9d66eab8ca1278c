package standin

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// DeployInterval is how often k3s's deploy controller looks at its manifests directory
// (pkg/deploy: every 15 seconds).
const DeployInterval = 15 * time.Second

// deployer applies the manifests in a directory the way k3s's deploy controller applies
// `server/manifests`: every file whose name ends in .yaml, .yml or .json (not a dotfile, and
// not one beside a NAME.skip file), walked in name order; every file at start, then a file
// again whenever its content changed; a file that fails is tried again at the next look.
// What the stand-in does not do of it: k3s records each file in an Addon object
// (k3s.cattle.io/v1, with Events on it) and deletes the objects a file no longer holds;
// the stand-in keeps the checksums in memory, says what it did on its log, and deletes
// nothing.
type deployer struct {
	dir    string
	client dynamic.Interface
	mapper meta.ResettableRESTMapper
	log    io.Writer
	// applied is each file's checksum as last applied.
	applied map[string]string
}

func newDeployer(cfg *rest.Config, dir string, log io.Writer) (*deployer, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &deployer{dir: dir, client: client, log: log, applied: map[string]string{},
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// run looks at the directory now and every DeployInterval until ctx ends.
func (d *deployer) run(ctx context.Context, interval time.Duration) {
	for {
		if err := d.scan(ctx); err != nil && ctx.Err() == nil {
			fmt.Fprintf(d.log, "k3s-standin: deploy: %v\n", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// scan applies every manifest not applied yet with its current content.
func (d *deployer) scan(ctx context.Context) error {
	files, err := d.files()
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sum := sha256.Sum256(b)
		check := hex.EncodeToString(sum[:])
		if d.applied[path] == check {
			continue
		}
		n, err := d.apply(ctx, b)
		if err != nil {
			errs = append(errs, fmt.Errorf("applying %s: %w", path, err))
			continue
		}
		d.applied[path] = check
		fmt.Fprintf(d.log, "k3s-standin: deploy: applied %s (%d objects)\n", path, n)
	}
	return errors.Join(errs...)
}

// files are the manifests to apply, in name order.
func (d *deployer) files() ([]string, error) {
	var all []string
	skips := map[string]bool{}
	err := filepath.WalkDir(d.dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			return nil
		}
		if name, ok := strings.CutSuffix(e.Name(), ".skip"); ok {
			skips[filepath.Join(filepath.Dir(path), name)] = true
		}
		all = append(all, path)
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", d.dir, err)
	}
	var out []string
	for _, p := range all {
		base := filepath.Base(p)
		ext := filepath.Ext(base)
		if strings.HasPrefix(base, ".") || skips[p] || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// appliedHash, on a CRD the deployer applied, is the SHA-256 of the object as its manifest
// has it. A CRD whose manifest has not changed since is not applied again, at a start
// either: an apply of liken's two CRDs (66 KB each), even one that changes nothing, took
// 0.25 to 0.7 s in a native API server, and under TCG it ran past the API server's request
// timeout (60 s) in three of a lab test's five server starts, holding back every manifest
// after it (liken-rbac.yaml, and with it a new machine's permissions, by two minutes). k3s's
// deploy controller applies such a CRD again, and would put back an operator's edit of it;
// the stand-in does not (docs/k3s.md).
const appliedHash = "k3s-standin.liken.dev/applied-hash"

var crdKind = schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}

// apply applies every object of a manifest with server-side apply, in order.
func (d *deployer) apply(ctx context.Context, content []byte) (int, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(content)))
	n := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			return n, err
		}
		if len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return n, err
		}
		gvk := obj.GroupVersionKind()
		m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			// A CRD applied a moment ago: look again.
			d.mapper.Reset()
			m, err = d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		}
		if err != nil {
			return n, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = d.client.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
			ri = d.client.Resource(m.Resource).Namespace(ns)
		}
		if gvk.GroupKind() == crdKind {
			// An unchanged CRD is not applied again (see appliedHash).
			sum := sha256.Sum256(js)
			hash := hex.EncodeToString(sum[:])
			if live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil && live.GetAnnotations()[appliedHash] == hash {
				n++
				continue
			}
			ann := obj.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			ann[appliedHash] = hash
			obj.SetAnnotations(ann)
			if js, err = obj.MarshalJSON(); err != nil {
				return n, err
			}
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, js, metav1.PatchOptions{FieldManager: "k3s-standin-deploy", Force: &force}); err != nil {
			return n, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		n++
	}
}
