package manifest

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"liken.dev/liken/api/v1alpha1"
)

// ObjectResult is one document and what is wrong with it.
type ObjectResult struct {
	Doc    Document
	Errors field.ErrorList
}

// SetResult is the outcome of checking a whole set of manifests: every object on its own,
// and the rules that span objects, which the API server cannot check one object at a time.
type SetResult struct {
	Objects   []ObjectResult
	SetErrors []string
	// Cluster and Machines are the typed objects, defaulted, when they are valid.
	Cluster  *v1alpha1.Cluster
	Machines []*v1alpha1.Machine
}

// OK reports whether every object and every cross-object rule passed.
func (r SetResult) OK() bool { return r.Invalid() == 0 && len(r.SetErrors) == 0 }

// Invalid counts the objects with errors of their own.
func (r SetResult) Invalid() int {
	n := 0
	for _, o := range r.Objects {
		if len(o.Errors) > 0 {
			n++
		}
	}
	return n
}

// CheckSet validates docs as the objects of one liken cluster: each as an API create, and
// each Machine's data disks named in a form liken's init resolves (diskPaths); then exactly
// one Cluster, unique Machine names, unique hardware matches, and every Machine's version
// override pinned in the Cluster.
func CheckSet(v *Validator, docs []Document) SetResult {
	var res SetResult
	seen := map[string]string{}
	macs := map[string]string{}
	serials := map[string]string{}
	for _, d := range docs {
		errs := v.Create(d.Object)
		res.Objects = append(res.Objects, ObjectResult{Doc: d, Errors: errs})
		if len(errs) > 0 {
			continue
		}
		switch d.Object.GetKind() {
		case "Cluster":
			c := &v1alpha1.Cluster{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, c); err != nil {
				res.SetErrors = append(res.SetErrors, fmt.Sprintf("%s: %v", d.Source, err))
				continue
			}
			if res.Cluster != nil {
				res.SetErrors = append(res.SetErrors, fmt.Sprintf("%s: a second Cluster: a liken cluster has exactly one", d.Source))
				continue
			}
			res.Cluster = c
		case "Machine":
			m := &v1alpha1.Machine{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, m); err != nil {
				res.SetErrors = append(res.SetErrors, fmt.Sprintf("%s: %v", d.Source, err))
				continue
			}
			if errs := diskPaths(m); len(errs) > 0 {
				res.Objects[len(res.Objects)-1].Errors = errs
				continue
			}
			if prev, ok := seen[m.Name]; ok {
				res.SetErrors = append(res.SetErrors, fmt.Sprintf("%s: Machine %q is also defined in %s", d.Source, m.Name, prev))
				continue
			}
			seen[m.Name] = d.Source
			if m.Spec.Match != nil {
				for _, mac := range m.Spec.Match.MACs {
					k := strings.ToLower(string(mac))
					if other, ok := macs[k]; ok {
						res.SetErrors = append(res.SetErrors, fmt.Sprintf("Machines %q and %q both match MAC %s: a machine must find exactly one manifest", other, m.Name, k))
					}
					macs[k] = m.Name
				}
				if s := m.Spec.Match.Serial; s != "" {
					if other, ok := serials[s]; ok {
						res.SetErrors = append(res.SetErrors, fmt.Sprintf("Machines %q and %q both match serial %q: a machine must find exactly one manifest", other, m.Name, s))
					}
					serials[s] = m.Name
				}
			}
			res.Machines = append(res.Machines, m)
		}
	}
	if res.Invalid() > 0 {
		return res
	}
	if res.Cluster == nil {
		res.SetErrors = append(res.SetErrors, "no Cluster: a liken cluster needs exactly one, named "+v1alpha1.ClusterName)
		return res
	}
	for _, m := range res.Machines {
		if m.Spec.Version == "" {
			continue
		}
		if _, ok := res.Cluster.Spec.Releases[string(m.Spec.Version)]; !ok {
			res.SetErrors = append(res.SetErrors, fmt.Sprintf("Machine %q: spec.version %s is not pinned in the Cluster's spec.releases", m.Name, m.Spec.Version))
		}
	}
	sort.Slice(res.Machines, func(i, j int) bool { return res.Machines[i].Name < res.Machines[j].Name })
	return res
}
