package policy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/test/apiserver"
	"liken.dev/liken/test/report"
)

var env *apiserver.Env

// kube-controller-manager runs only the controller that type-checks admission policies.
func TestMain(m *testing.M) {
	os.Exit(apiserver.Main(m, "policy", apiserver.Options{ControllerManager: true, Controllers: "validatingadmissionpolicy-status-controller"}, &env))
}

// TestEveryEntryWarns: every class-table entry but the Immutable ones has exactly one
// warning, naming its field and class; an Immutable one has none (the CRD refuses it).
func TestEveryEntryWarns(t *testing.T) {
	ws := ChangeWarnings()
	for _, f := range v1alpha1.FieldClasses {
		prefix := strings.ToUpper(f.Path[:1]) + kindOf(f.Path)[1:] + " " + fieldPath(f.Path) + ": " + string(f.Class) + " class; "
		n := 0
		for _, w := range ws {
			for _, v := range w.Policy.Spec.Validations {
				if strings.HasPrefix(v.Message, prefix) {
					n++
					if want := ChangeWarningsName + "-" + kindOf(f.Path) + "s"; w.Policy.Name != want {
						t.Errorf("%s's warning is in policy %s; want %s", f.Path, w.Policy.Name, want)
					}
				}
			}
		}
		switch {
		case Warned(f) && n != 1:
			t.Errorf("%s (%s) has %d warnings; want 1", f.Path, f.Class, n)
		case !Warned(f) && n != 0:
			t.Errorf("%s (%s) has %d warnings; want none", f.Path, f.Class, n)
		}
	}
}

// warnings collects the API server's warnings on a client's requests.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	w.seen = append(w.seen, text)
	w.mu.Unlock()
}

// take returns the warnings seen since the last take, each with the policy's name taken
// off (an error for one that is no change warning), sorted.
func (w *warnings) take(t *testing.T) []string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, s := range w.seen {
		m, ok := Strip(s)
		if !ok {
			t.Errorf("a warning that is no change warning: %q", s)
		}
		out = append(out, m)
	}
	w.seen = nil
	sort.Strings(out)
	return out
}

// TestChangeWarnings installs the policy in a real API server and edits a Machine and the
// Cluster: each changed field group warns with its class, two at once warn twice, an update
// that changes nothing and a status update warn nothing, an Immutable change is refused,
// and kubectl prints the warning to the operator. Never a request refused for a warning.
func TestChangeWarnings(t *testing.T) {
	ctx := t.Context()
	admin, err := kubernetes.NewForConfig(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	ws := ChangeWarnings()
	validations := 0
	for _, w := range ws {
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, w.Policy, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, w.Binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		validations += len(w.Policy.Spec.Validations)
	}
	cfg := rest.CopyConfig(env.Admin)
	w := &warnings{}
	cfg.WarningHandler = w
	lc, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lc.CreateMachine(ctx, &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "warned-1"}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}})
	if err != nil {
		t.Fatal(err)
	}
	entry := func(path string) v1alpha1.FieldClass {
		f, ok := v1alpha1.ClassOf(path)
		if !ok {
			t.Fatalf("no class-table entry for %s", path)
		}
		return f
	}
	// kube-controller-manager type-checks each policy's expressions against its CRD's schema.
	for _, w := range ws {
		var got *admissionv1.ValidatingAdmissionPolicy
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			got, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, w.Policy.Name, metav1.GetOptions{})
			return err == nil && got.Status.TypeChecking != nil, nil
		})
		if err != nil {
			t.Fatalf("%s was not type-checked: %v", w.Policy.Name, err)
		}
		if len(got.Status.TypeChecking.ExpressionWarnings) > 0 {
			t.Errorf("%s: faults in its expressions: %+v", w.Policy.Name, got.Status.TypeChecking.ExpressionWarnings)
		}
	}
	// A new policy takes effect once the API server's informer has it.
	sysctl := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sysctl++
		m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": v1alpha1.SysctlValue(string(rune('0' + sysctl%10)))}
		if m, err = lc.UpdateMachine(ctx, m); err != nil {
			return false, err
		}
		return len(w.take(t)) > 0, nil
	})
	if err != nil {
		t.Fatalf("no warning on a sysctl edit within a minute of installing the policy: %v", err)
	}

	for _, tc := range []struct {
		name  string
		edit  func(m *v1alpha1.Machine)
		paths []string
	}{
		{"a sysctl: live", func(m *v1alpha1.Machine) { m.Spec.Sysctls = v1alpha1.Sysctls{"vm.max_map_count": "262144"} }, []string{"machine.spec.sysctls"}},
		{"kernel arguments: the next boot", func(m *v1alpha1.Machine) { m.Spec.KernelArgs = []v1alpha1.KernelArg{"quiet"} }, []string{"machine.spec.kernelArgs"}},
		{"the network: a reboot", func(m *v1alpha1.Machine) {
			m.Spec.Network = &v1alpha1.MachineNetwork{Interfaces: []v1alpha1.Interface{{Name: "eth0", DHCP: true}}}
		}, []string{"machine.spec.network"}},
		{"two groups at once", func(m *v1alpha1.Machine) {
			m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"example.com/rack": "r1"}
			m.Spec.KernelArgs = nil
		}, []string{"machine.spec.kernelArgs", "machine.spec.nodeLabels"}},
		{"nothing", func(*v1alpha1.Machine) {}, nil},
		{"a label of the object's own", func(m *v1alpha1.Machine) { m.Labels = map[string]string{"example.com/team": "a"} }, nil},
	} {
		tc.edit(m)
		if m, err = lc.UpdateMachine(ctx, m); err != nil {
			t.Fatalf("%s: the update was refused: %v", tc.name, err)
		}
		var want []string
		for _, p := range tc.paths {
			want = append(want, Message(entry(p)))
		}
		sort.Strings(want)
		if got := w.take(t); !slices.Equal(got, want) {
			t.Errorf("%s: warnings %q; want %q", tc.name, got, want)
		}
	}
	m.Status.Reboot.State = v1alpha1.RebootNone
	m.Status.PendingCount = 2
	if m, err = lc.UpdateMachineStatus(ctx, m); err != nil {
		t.Fatal(err)
	}
	if got := w.take(t); len(got) > 0 {
		t.Errorf("a status update warned: %q", got)
	}
	// Immutable: the CRD's rule refuses it, with no class warning.
	m.Spec.Role = v1alpha1.RoleServer
	if _, err := lc.UpdateMachine(ctx, m); err == nil || !strings.Contains(err.Error(), "role") {
		t.Errorf("a role change: %v; want refused", err)
	}
	if got := w.take(t); len(got) > 0 {
		t.Errorf("a refused role change warned: %q", got)
	}

	// The Cluster: a servers-only feature and the registries, which restart k3s.
	cl, err := lc.Cluster(ctx)
	if err != nil {
		cl, err = lc.CreateCluster(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterName},
			Spec: v1alpha1.ClusterSpec{Channel: "file:///srv/channel", Version: "2026.07.20-001",
				Releases: map[string]v1alpha1.Digest{"2026.07.20-001": v1alpha1.Digest("sha256:" + strings.Repeat("0", 64))}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A typed client writes the fields it always has (drain, say) and defaults fill them:
	// stored once, they are no change after.
	if cl, err = lc.UpdateCluster(ctx, cl); err != nil {
		t.Fatal(err)
	}
	w.take(t)
	off := false
	cl.Spec.Features.Traefik = &off
	cl.Spec.Registries = &v1alpha1.Registries{Mirrors: []v1alpha1.RegistryMirror{{Registry: "docker.io", Endpoints: []string{"https://mirror.example"}}}}
	if _, err := lc.UpdateCluster(ctx, cl); err != nil {
		t.Fatal(err)
	}
	want := []string{Message(entry("cluster.spec.features.traefik")), Message(entry("cluster.spec.registries"))}
	sort.Strings(want)
	if got := w.take(t); !slices.Equal(got, want) {
		t.Errorf("a Cluster edit: warnings %q; want %q", got, want)
	}
	if !strings.Contains(want[0]+want[1], "Cluster spec.features.traefik: RestartK3s class; each server restarts k3s in place") {
		t.Errorf("the servers-only feature's warning does not say only servers restart: %q", want)
	}

	// What an operator sees: kubectl prints the warning and the edit is made.
	out, err := exec.CommandContext(ctx, filepath.Join(env.Bin, "kubectl"), "--kubeconfig="+env.AdminKubeconfig,
		"patch", "machine", "warned-1", "--type=merge", "-p", `{"spec":{"network":null}}`).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Warning: ") || !strings.Contains(string(out), ": Machine spec.network: Reboot class; each affected machine stages it") {
		t.Errorf("kubectl patch of spec.network: %v\n%s", err, out)
	}
	if m, err = lc.Machine(ctx, m.Name); err != nil {
		t.Fatal(err)
	}

	// What the policy adds to an update: the median of 100 with it and 100 without.
	median := func() time.Duration {
		var d []time.Duration
		for i := range 100 {
			m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": v1alpha1.SysctlValue(string(rune('0' + i%10)))}
			start := time.Now()
			if m, err = lc.UpdateMachine(ctx, m); err != nil {
				t.Fatal(err)
			}
			d = append(d, time.Since(start))
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	with := median()
	for _, w := range ws {
		if err := admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, w.Binding.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The binding's removal reaches the API server's informer first.
	wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m.Spec.Sysctls = v1alpha1.Sysctls{"vm.swappiness": v1alpha1.SysctlValue("1" + string(rune('0'+time.Now().Nanosecond()%10)))}
		if m, err = lc.UpdateMachine(ctx, m); err != nil {
			return false, err
		}
		return len(w.take(t)) == 0, nil
	})
	without := median()
	report.Line("change warnings (ValidatingAdmissionPolicy, %d validations): a Machine update's median %s with the policy, %s without (100 each, one run)",
		validations, with.Round(10*time.Microsecond), without.Round(10*time.Microsecond))
}
