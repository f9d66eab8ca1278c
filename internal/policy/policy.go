// Package policy holds the admission policies liken installs in a cluster beside its CRDs.
// The change warnings say, on kubectl apply, edit or patch of a Cluster or Machine, what
// each changed field group will do to the machines: its change class from the class table
// (api/v1alpha1/classes.go) and what follows. They are made from the table itself, so they
// cannot drift from what the agent does, and they never block a request: the API server
// only warns (validationActions Warn), and kubectl prints each warning.
package policy

import (
	"fmt"
	"regexp"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
)

// ChangeWarningsName names the policies and their bindings, with the kind's resource
// ("liken-change-warnings-machines"): one for each kind, since the API server type-checks
// every expression against the schema of every kind its policy matches.
const ChangeWarningsName = "liken-change-warnings"

// Warned reports whether a change of the class-table entry gets a warning: every class but
// Immutable, whose change the CRD's own rules refuse with a message of their own.
func Warned(f v1alpha1.FieldClass) bool { return f.Class != v1alpha1.Immutable }

// Follows says what a change of class does, as the warnings say it.
func Follows(f v1alpha1.FieldClass) string {
	on := "each affected machine"
	if f.ServersOnly {
		on = "each server"
	}
	switch f.Class {
	case v1alpha1.Live:
		return "applied within seconds by " + on + ", no restart"
	case v1alpha1.RestartK3s:
		return on + " restarts k3s in place; pods keep running"
	case v1alpha1.NextBoot:
		return on + " stages it; it takes effect at the machine's next boot, whatever its reason"
	case v1alpha1.Reboot:
		return on + " stages it and waits for a disruption-budget turn and, with rebootPolicy Manual, liken approve-reboot; then it drains and reboots"
	}
	return "refused by the API server"
}

// Message is the warning for a change of the entry's fields: "Machine spec.network: Reboot
// class; ...".
func Message(f v1alpha1.FieldClass) string {
	kind := "Machine"
	if kindOf(f.Path) == "cluster" {
		kind = "Cluster"
	}
	return fmt.Sprintf("%s %s: %s class; %s (%s)", kind, fieldPath(f.Path), f.Class, Follows(f), f.Why)
}

// fieldPath is the entry's path in the object: "machine.spec.network" is "spec.network".
func fieldPath(path string) string {
	_, p, _ := strings.Cut(path, ".")
	return p
}

// kindOf is the entry's kind: "machine" or "cluster".
func kindOf(path string) string {
	k, _, _ := strings.Cut(path, ".")
	return k
}

// unchanged is a CEL expression that holds when the field at path is the same in the old
// and the new object, present in neither counting as the same (optional field selection).
func unchanged(path string) string {
	sel := strings.ReplaceAll(fieldPath(path), ".", ".?")
	return fmt.Sprintf("oldObject.?%s == object.?%s", sel, sel)
}

// Warnings are a kind's policy and binding.
type Warnings struct {
	Policy  *admissionv1.ValidatingAdmissionPolicy
	Binding *admissionv1.ValidatingAdmissionPolicyBinding
}

// ChangeWarnings are the policies and their bindings, Machines' then the Cluster's: on an
// update of one, a warning for every class-table entry whose fields changed.
func ChangeWarnings() []Warnings {
	var out []Warnings
	for _, k := range []struct{ kind, resource string }{{"machine", "machines"}, {"cluster", "clusters"}} {
		name := ChangeWarningsName + "-" + k.resource
		ignore := admissionv1.Ignore
		p := &admissionv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				// A policy that cannot be evaluated must never stand in an operator's way.
				FailurePolicy: &ignore,
				MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionv1.RuleWithOperations{
						Operations: []admissionv1.OperationType{admissionv1.Update},
						// The spec only: status is written through its own subresource.
						Rule: admissionv1.Rule{APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version},
							Resources: []string{k.resource}},
					},
				}}},
			},
		}
		for _, f := range v1alpha1.FieldClasses {
			if kindOf(f.Path) == k.kind && Warned(f) {
				p.Spec.Validations = append(p.Spec.Validations, admissionv1.Validation{Expression: unchanged(f.Path), Message: Message(f)})
			}
		}
		b := &admissionv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        name,
				ValidationActions: []admissionv1.ValidationAction{admissionv1.Warn},
			},
		}
		out = append(out, Warnings{p, b})
	}
	return out
}

// warningPrefix is how the API server begins the warning of a policy's message: "Validation
// failed for ValidatingAdmissionPolicy 'P' with binding 'B': MESSAGE".
var warningPrefix = regexp.MustCompile(`^Validation failed for ValidatingAdmissionPolicy '` + ChangeWarningsName + `-[a-z]+' with binding '[^']*': `)

// Strip is a warning the API server sent with the policy's name taken off, and whether it
// was one of the change warnings.
func Strip(warning string) (string, bool) {
	if loc := warningPrefix.FindStringIndex(warning); loc != nil {
		return warning[loc[1]:], true
	}
	return warning, false
}
