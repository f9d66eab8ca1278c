// Package v1alpha1 is liken's API: the Cluster and Machine resources of group liken.dev.
//
// Operators write spec; each machine writes its own Machine's status. Every spec field has
// exactly one change class (see classes.go), which decides how a machine applies a change to
// it: live, by restarting k3s in place, at the next boot, by a reboot of its own, or never
// (the API refuses the change).
//
// +kubebuilder:object:generate=true
// +groupName=liken.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of Cluster and Machine.
var GroupVersion = schema.GroupVersion{Group: "liken.dev", Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers Cluster and Machine (and their lists) with a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &Cluster{}, &ClusterList{}, &Machine{}, &MachineList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
