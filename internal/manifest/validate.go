// Package manifest reads Cluster and Machine manifests and checks them offline with exactly
// the schema, defaults and CEL rules the Kubernetes API server applies to them (the same
// apiextensions-apiserver code, fed the same generated CRDs), so `liken validate` and
// `liken layer` refuse what kubectl would refuse, with the same messages. CheckSet adds what
// the API server cannot check: the rules across objects, and data disks named in a form
// liken's init never resolves.
package manifest

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	structuralpruning "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured/unstructuredscheme"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	"liken.dev/liken/config/crd"
)

// Validator checks objects of liken's kinds as the API server does.
type Validator struct {
	kinds map[schema.GroupVersionKind]*kind
}

type kind struct {
	structural *structuralschema.Structural
	strategy   rest.RESTCreateUpdateStrategy
}

// NewValidator builds a Validator from liken's embedded CRDs.
func NewValidator() (*Validator, error) {
	crds, err := crd.All()
	if err != nil {
		return nil, err
	}
	v := &Validator{kinds: map[schema.GroupVersionKind]*kind{}}
	for _, c := range crds {
		for _, ver := range c.Spec.Versions {
			gvk := schema.GroupVersionKind{Group: c.Spec.Group, Version: ver.Name, Kind: c.Spec.Names.Kind}
			k, err := newKind(c, ver, gvk)
			if err != nil {
				return nil, fmt.Errorf("loading schema of %s: %w", gvk, err)
			}
			v.kinds[gvk] = k
		}
	}
	return v, nil
}

func newKind(c *apiextensionsv1.CustomResourceDefinition, ver apiextensionsv1.CustomResourceDefinitionVersion, gvk schema.GroupVersionKind) (*kind, error) {
	val, err := apihelpers.GetSchemaForVersion(c, ver.Name)
	if err != nil || val == nil {
		return nil, fmt.Errorf("no schema: %v", err)
	}
	internal := &apiextensionsinternal.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(val, internal, nil); err != nil {
		return nil, fmt.Errorf("converting schema: %w", err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("structural schema: %w", err)
	}
	s = s.DeepCopy()
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		return nil, fmt.Errorf("pruning defaults: %w", err)
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("schema validator: %w", err)
	}
	var statusValidator apiservervalidation.SchemaValidator
	if st, ok := internal.OpenAPIV3Schema.Properties["status"]; ok {
		if statusValidator, _, err = apiservervalidation.NewSchemaValidator(&st); err != nil {
			return nil, fmt.Errorf("status validator: %w", err)
		}
	}
	var status *apiextensionsinternal.CustomResourceSubresourceStatus
	if ver.Subresources != nil && ver.Subresources.Status != nil {
		status = &apiextensionsinternal.CustomResourceSubresourceStatus{}
	}
	strategy := customresource.NewStrategy(unstructuredscheme.NewUnstructuredObjectTyper(),
		c.Spec.Scope == apiextensionsv1.NamespaceScoped, gvk, validator, statusValidator, s, status, nil, nil)
	return &kind{structural: s, strategy: strategy}, nil
}

// Kinds lists the group/version/kinds the Validator knows.
func (v *Validator) Kinds() []schema.GroupVersionKind {
	var out []schema.GroupVersionKind
	for k := range v.kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// Create checks obj as a create request: unknown fields are errors (as with kubectl's default
// strict field validation), defaults are applied to obj in place, status is dropped.
func (v *Validator) Create(obj *unstructured.Unstructured) field.ErrorList {
	k, errs := v.prepare(obj)
	if k == nil {
		return errs
	}
	ctx := genericapirequest.NewContext()
	k.strategy.PrepareForCreate(ctx, obj)
	errs = append(errs, apimachineryvalidation.ValidateObjectMetaAccessor(obj, false, apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	return append(errs, k.strategy.Validate(ctx, obj)...)
}

// Update checks obj as an update of old (both are defaulted in place), so immutable fields
// and other transition rules are enforced.
func (v *Validator) Update(obj, old *unstructured.Unstructured) field.ErrorList {
	k, errs := v.prepare(obj)
	if k == nil {
		return errs
	}
	if _, oldErrs := v.prepare(old); len(oldErrs) > 0 {
		return append(errs, field.Invalid(field.NewPath(""), old.GetName(), "the old object is itself invalid"))
	}
	if obj.GroupVersionKind() != old.GroupVersionKind() || obj.GetName() != old.GetName() {
		return append(errs, field.Invalid(field.NewPath("metadata", "name"), obj.GetName(), "an update must keep the kind and name"))
	}
	// Manifests on disk carry no resourceVersion; an update needs one.
	for _, u := range []*unstructured.Unstructured{obj, old} {
		if u.GetResourceVersion() == "" {
			u.SetResourceVersion("1")
		}
	}
	ctx := genericapirequest.NewContext()
	k.strategy.PrepareForUpdate(ctx, obj, old)
	return append(errs, k.strategy.ValidateUpdate(ctx, obj, old)...)
}

// prepare finds obj's kind, reports unknown fields and applies defaults, as the API server's
// decoder does before validation.
func (v *Validator) prepare(obj *unstructured.Unstructured) (*kind, field.ErrorList) {
	gvk := obj.GroupVersionKind()
	k, ok := v.kinds[gvk]
	if !ok {
		return nil, field.ErrorList{field.NotSupported(field.NewPath("kind"), gvk.String(), v.kindNames())}
	}
	var errs field.ErrorList
	unknown := structuralpruning.PruneWithOptions(obj.Object, k.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range unknown {
		errs = append(errs, field.Invalid(field.NewPath(p), "", "unknown field \""+p+"\""))
	}
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(obj.Object, k.structural)
	structuraldefaulting.Default(obj.Object, k.structural)
	return k, errs
}

func (v *Validator) kindNames() []string {
	var out []string
	for _, k := range v.Kinds() {
		out = append(out, k.GroupVersion().String()+", Kind="+k.Kind)
	}
	return out
}

// Describe formats errs for one object the way kubectl shows the API server's answer.
func Describe(obj *unstructured.Unstructured, errs field.ErrorList) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q is invalid:", obj.GetKind(), obj.GetName())
	for _, e := range errs {
		b.WriteString("\n  * " + e.Error())
	}
	return b.String()
}
