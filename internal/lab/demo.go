package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"liken.dev/liken/internal/release"
	"liken.dev/liken/internal/standin/image"
)

// The lab's workload (issue 26): liken-demo (cmd/liken-demo), an HTTP server that says which
// pod and node answered, built by `lab up` into an image its channel server also serves as a
// registry, which the machines pull through the Cluster's registry mirror.
const (
	// DemoRegistry is the registry name the demo image carries; the lab's Cluster mirrors
	// it to the channel server (there is no such registry anywhere else).
	DemoRegistry = "lab.liken.test"
	DemoImage    = DemoRegistry + "/liken-demo:1"
	// DemoName names the Deployment, its PodDisruptionBudget and its Service.
	DemoName = "web"
	// DemoNodePort is the Service's node port, which every machine's QEMU forwards from a
	// local port of the host (Machine.DemoPort).
	DemoNodePort = 30080
)

// buildDemo builds liken-demo from source and writes its image archive into dir, reproducibly
// (epoch is every time the image records).
func buildDemo(source, dir string, epoch time.Time) error {
	tmp, err := os.MkdirTemp("", "liken-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	prog := filepath.Join(tmp, "liken-demo")
	if err := release.GoBuild(source, "./cmd/liken-demo", prog); err != nil {
		return fmt.Errorf("building the demo: %w", err)
	}
	b, err := os.ReadFile(prog)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var archive bytes.Buffer
	if _, err := image.WriteArchive(&archive, image.Spec{Ref: DemoImage, Entrypoint: []string{"/liken-demo"}, User: "65532:65532",
		Files: []image.File{{Path: "/liken-demo", Mode: 0o755, Data: b}}, Epoch: epoch}); err != nil {
		return fmt.Errorf("the demo image: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "liken-demo.tar"), archive.Bytes(), 0o644)
}

// demoObjects are the demo's Deployment (two replicas, spread over the machines), the budget
// that keeps one of them available through drains, and a NodePort Service whose traffic stays
// on the machine it reached (externalTrafficPolicy Local), so that each machine's forwarded
// port answers from that machine's pod, as an external load balancer with health checks
// would use them.
func demoObjects() (*appsv1.Deployment, *policyv1.PodDisruptionBudget, *corev1.Service) {
	labels := map[string]string{"app": DemoName}
	// The grace period outlasts the demo's drain (15 s of serving after SIGTERM, cmd/liken-demo).
	replicas, grace := int32(2), int64(30)
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	d := &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: DemoName, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Containers: []corev1.Container{{
						Name: "demo", Image: DemoImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
						Env:   []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: field("metadata.name")}, {Name: "NODE_NAME", ValueFrom: field("spec.nodeName")}},
						// Ready at the first answer; not ready only after half a minute without
						// one: a machine without KVM, starved of the host's CPU, may take
						// seconds to answer a probe while its pod serves.
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
							PeriodSeconds: 2, TimeoutSeconds: 5, FailureThreshold: 5},
					}},
					// Preferred, not required: one pod per machine while both can run one, and
					// a drained machine's pod comes back on the other.
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100,
							PodAffinityTerm: corev1.PodAffinityTerm{LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: "kubernetes.io/hostname"}}},
					}},
				},
			},
		},
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: DemoName, Namespace: "default"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: DemoName, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: DemoNodePort}}},
	}
	return d, pdb, svc
}

// DemoManifest is the demo's objects as YAML, as `lab up` writes them beside the Cluster's.
func DemoManifest() ([]byte, error) {
	d, pdb, svc := demoObjects()
	var out bytes.Buffer
	out.WriteString("# The lab's demo workload, which liken lab up deploys (docs/lab.md).\n")
	for i, o := range []any{d, pdb, svc} {
		b, err := yaml.Marshal(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes(), nil
}

// deployDemo creates the demo's objects (those that exist already are left as they are).
func deployDemo(ctx context.Context, client kubernetes.Interface) error {
	d, pdb, svc := demoObjects()
	if _, err := client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Deployment %s: %w", DemoName, err)
	}
	if _, err := client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating PodDisruptionBudget %s: %w", DemoName, err)
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Service %s: %w", DemoName, err)
	}
	return nil
}

// DemoAnswer asks the demo through a machine's forwarded node port, as a client outside the
// cluster would, and returns its answer; within 5 seconds unless ctx has a deadline.
func DemoAnswer(ctx context.Context, port int, path string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return strings.TrimSpace(string(b)), nil
}

// waitDemo waits until the demo answers on every machine's forwarded port from a pod on
// that machine, and returns the answers by machine.
func (s *State) waitDemo(ctx context.Context, client kubernetes.Interface, timeout time.Duration, say func(string, ...any)) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	answers := map[string]string{}
	var last error
	var moved time.Time
	for {
		// The spread is only preferred (a drain must be able to put both pods on one
		// machine): a machine the scheduler could not use for a moment (its Node NotReady
		// while its one vCPU was starved, as measured beside the VM tier) gets none. Then
		// one pod of a crowded machine is deleted, at most once a minute, and its
		// replacement goes where the anti-affinity prefers.
		if time.Since(moved) > time.Minute {
			if pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + DemoName}); err == nil {
				if victim := crowdedPod(pods.Items, s.machineNames()); victim != "" {
					say("the demo's pods are not on every machine: deleting %s so that its replacement spreads", victim)
					if err := client.CoreV1().Pods("default").Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
						say("deleting %s: %v", victim, err)
					}
					moved = time.Now()
				}
			}
		}
		for _, m := range s.Machines {
			if _, ok := answers[m.Name]; ok || m.DemoPort == 0 {
				continue
			}
			a, err := DemoAnswer(ctx, m.DemoPort, "/")
			if err == nil && !strings.HasSuffix(a, " on node "+m.Name) {
				err = fmt.Errorf("answered %q, not from a pod on %s", a, m.Name)
			}
			if err != nil {
				last = fmt.Errorf("%s: %w", m.Name, err)
				continue
			}
			answers[m.Name] = a
			say("%s: the demo answers at http://127.0.0.1:%d/: %s", m.Name, m.DemoPort, a)
		}
		if len(answers) >= min(2, len(s.Machines)) {
			return answers, nil
		}
		if time.Now().After(deadline) {
			return answers, fmt.Errorf("the demo did not answer on every machine within %s (last: %v)", timeout, last)
		}
		select {
		case <-ctx.Done():
			return answers, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

func (s *State) machineNames() []string {
	var out []string
	for _, m := range s.Machines {
		out = append(out, m.Name)
	}
	return out
}

// crowdedPod names a running demo pod to delete when a machine has none and another has
// more than one (the newest there), or "" when the pods are spread or still starting.
func crowdedPod(pods []corev1.Pod, machines []string) string {
	on := map[string][]corev1.Pod{}
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
			return "" // one still being placed or started: wait for it
		}
		on[p.Spec.NodeName] = append(on[p.Spec.NodeName], p)
	}
	empty := false
	for _, m := range machines {
		empty = empty || len(on[m]) == 0
	}
	if !empty {
		return ""
	}
	for _, m := range machines {
		if ps := on[m]; len(ps) > 1 {
			newest := ps[0]
			for _, p := range ps[1:] {
				if newest.CreationTimestamp.Before(&p.CreationTimestamp) {
					newest = p
				}
			}
			return newest.Name
		}
	}
	return ""
}

// demoPods says where the demo's pods are and how they are, for an error: the machine whose
// node port does not answer may have none (the spread is only preferred), or one not ready.
func demoPods(ctx context.Context, client kubernetes.Interface) string {
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + DemoName})
	if err != nil {
		return "not listed: " + err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		d := fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady || (c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue) {
				d += fmt.Sprintf(", %s=%s %s", c.Type, c.Status, c.Message)
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil {
				d += fmt.Sprintf(", container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
			}
			d += fmt.Sprintf(", %d restarts", cs.RestartCount)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// freePort is a TCP port of the host's loopback free right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	if a, ok := l.Addr().(*net.TCPAddr); ok {
		return a.Port, nil
	}
	return 0, errors.New("not a TCP address")
}
