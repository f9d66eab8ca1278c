package cli

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/host/k3s"
	"liken.dev/liken/internal/manifest"
)

// joinPlan reads from the manifests how their machines come together (k3s.JoinPlan), and
// refuses, before anything is written, a cluster in which a machine has no way to join:
// such layers would boot machines that wait for a cluster they cannot reach, or servers
// that each start a cluster of their own.
func joinPlan(docs []manifest.Document) (k3s.JoinPlan, error) {
	var cluster v1alpha1.ClusterSpec
	var machines []*v1alpha1.Machine
	for _, d := range docs {
		if d.Object.GetAPIVersion() != v1alpha1.GroupVersion.String() {
			continue
		}
		switch d.Object.GetKind() {
		case "Cluster":
			c := &v1alpha1.Cluster{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, c); err != nil {
				// Not a Cluster the API would take: building the layers says why, in the
				// API's own words.
				return k3s.JoinPlan{}, nil
			}
			cluster = c.Spec
		case "Machine":
			m := &v1alpha1.Machine{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object.Object, m); err != nil {
				return k3s.JoinPlan{}, nil
			}
			machines = append(machines, m)
		}
	}
	plan := k3s.PlanJoin(cluster, machines)
	if err := plan.Check(machines); err != nil {
		return k3s.JoinPlan{}, fmt.Errorf("checking how the machines join the cluster: %w; no layer was built: give the Cluster a spec.registrationAddress, or the first server a static address", err)
	}
	return plan, nil
}
