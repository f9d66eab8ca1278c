package authority

import (
	"context"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "authority", apiserver.Options{}, &env)) }

func cluster() *v1alpha1.Cluster {
	return &v1alpha1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ClusterName},
		Spec: v1alpha1.ClusterSpec{
			Channel:  "file:///srv/channel",
			Releases: map[string]v1alpha1.Digest{"2026.07.20-001": "sha256:0000000000000000000000000000000000000000000000000000000000000000"},
			Version:  "2026.07.20-001",
		},
	}
}

func machine(name string) *v1alpha1.Machine {
	return &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.MachineSpec{Role: v1alpha1.RoleAgent}}
}

// TestMachineCredentials proves, against a real API server configured as k3s configures its
// own, what a machine's own certificate can and cannot do.
func TestMachineCredentials(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	adminLiken, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, admin, "m1", "m2"); err != nil {
		t.Fatal(err)
	}
	// Twice: install is idempotent.
	if err := Install(ctx, admin, "m1", "m2"); err != nil {
		t.Fatal(err)
	}
	if _, err := adminLiken.CreateCluster(ctx, cluster()); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"m1", "m2"} {
		if _, err := adminLiken.CreateMachine(ctx, machine(n)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: v1alpha1.SecretNamespace}, StringData: map[string]string{"username": "u"}}
	if _, err := admin.CoreV1().Secrets(v1alpha1.SecretNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The coordinator names the Cluster's registry Secrets in the machines' Role.
	if _, err := SyncRegistrySecrets(ctx, admin, []string{"registry"}); err != nil {
		t.Fatal(err)
	}

	cfg, err := env.UserConfig(User("m1"), Group)
	if err != nil {
		t.Fatal(err)
	}
	m1kube := kubernetes.NewForConfigOrDie(cfg)
	m1, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m1rest := restFor(t, cfg)

	allowed := []struct {
		name string
		do   func(context.Context) error
	}{
		{"read own Machine", func(ctx context.Context) error { _, err := m1.Machine(ctx, "m1"); return err }},
		{"read the Cluster", func(ctx context.Context) error { _, err := m1.Cluster(ctx); return err }},
		{"list and watch own Machine by name", func(ctx context.Context) error {
			_, err := m1.MachineListWatch("m1").List(metav1.ListOptions{})
			if err != nil {
				return err
			}
			w, err := m1.MachineListWatch("m1").Watch(metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"list and watch the Cluster by name", func(ctx context.Context) error {
			_, err := m1.ClusterListWatch().List(metav1.ListOptions{})
			return err
		}},
		{"write own Machine status", func(ctx context.Context) error {
			m, err := m1.Machine(ctx, "m1")
			if err != nil {
				return err
			}
			m.Status.PendingCount = 0
			m.Status.ObservedGeneration = m.Generation
			_, err = m1.UpdateMachineStatus(ctx, m)
			return err
		}},
		{"label own Node", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Nodes().Patch(ctx, "m1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"taint and cordon own Node", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Nodes().Patch(ctx, "m1", types.MergePatchType, []byte(`{"spec":{"unschedulable":true,"taints":[{"key":"k","effect":"NoSchedule"}]}}`), metav1.PatchOptions{})
			return err
		}},
		{"watch own Node by name", func(ctx context.Context) error {
			_, err := kube.NodeListWatch(m1kube.CoreV1().RESTClient(), "m1").List(metav1.ListOptions{})
			return err
		}},
		{"read a registry Secret", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Secrets(v1alpha1.SecretNamespace).Get(ctx, "registry", metav1.GetOptions{})
			return err
		}},
		{"record an Event", func(ctx context.Context) error {
			ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "m1.", Namespace: EventNamespace},
				InvolvedObject: corev1.ObjectReference{Kind: "Machine", Name: "m1", APIVersion: "liken.dev/v1alpha1"},
				Reason:         "Test", Message: "test", Type: corev1.EventTypeNormal, FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1}
			_, err := m1kube.CoreV1().Events(EventNamespace).Create(ctx, ev, metav1.CreateOptions{})
			return err
		}},
	}
	for _, a := range allowed {
		if err := a.do(ctx); err != nil {
			t.Errorf("machine m1 cannot %s: %v", a.name, err)
		}
	}

	denied := []struct {
		name string
		do   func(context.Context) error
	}{
		{"read another Machine", func(ctx context.Context) error { _, err := m1.Machine(ctx, "m2"); return err }},
		{"read a Secret the Cluster does not name", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Secrets(v1alpha1.SecretNamespace).Get(ctx, "not-a-registry", metav1.GetOptions{})
			return err
		}},
		{"list the Secrets", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Secrets(v1alpha1.SecretNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list all Machines", func(ctx context.Context) error {
			return m1rest.Get().Resource("machines").Do(ctx).Error()
		}},
		{"write another Machine's status", func(ctx context.Context) error {
			m, err := adminLiken.Machine(ctx, "m2")
			if err != nil {
				return err
			}
			_, err = m1.UpdateMachineStatus(ctx, m)
			return err
		}},
		{"write its own spec", func(ctx context.Context) error {
			m, err := adminLiken.Machine(ctx, "m1")
			if err != nil {
				return err
			}
			m.Spec.NodeLabels = map[string]v1alpha1.LabelValue{"self": "granted"}
			_, err = m1.UpdateMachine(ctx, m)
			return err
		}},
		{"approve its own reboot", func(ctx context.Context) error {
			return m1rest.Patch(types.MergePatchType).Resource("machines").Name("m1").
				Body([]byte(`{"spec":{"reboot":{"approval":{"pendingHash":"sha256:` + zeros + `"}}}}`)).Do(ctx).Error()
		}},
		{"approve through the status subresource", func(ctx context.Context) error {
			// The status subresource ignores spec: the approval must not be stored.
			err := m1rest.Patch(types.MergePatchType).Resource("machines").Name("m1").SubResource("status").
				Body([]byte(`{"spec":{"reboot":{"approval":{"pendingHash":"sha256:` + zeros + `"}}}}`)).Do(ctx).Error()
			if err != nil {
				return err
			}
			m, _ := adminLiken.Machine(ctx, "m1")
			if m.Spec.Reboot != nil {
				return nil // stored: reported as allowed below
			}
			return apierrors.NewForbidden(v1alpha1.GroupVersion.WithResource("machines").GroupResource(), "m1", nil)
		}},
		{"change the Cluster", func(ctx context.Context) error {
			c, err := adminLiken.Cluster(ctx)
			if err != nil {
				return err
			}
			c.Spec.RebootPolicy = v1alpha1.RebootAuto
			_, err = m1.UpdateCluster(ctx, c)
			return err
		}},
		{"delete its own Machine", func(ctx context.Context) error {
			return m1rest.Delete().Resource("machines").Name("m1").Do(ctx).Error()
		}},
		{"create a Machine", func(ctx context.Context) error { _, err := m1.CreateMachine(ctx, machine("m3")); return err }},
		{"label another Node", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Nodes().Patch(ctx, "m2", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"delete its own Node", func(ctx context.Context) error {
			return m1kube.CoreV1().Nodes().Delete(ctx, "m1", metav1.DeleteOptions{})
		}},
		{"read Secrets elsewhere", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"cordon another Node", func(ctx context.Context) error {
			_, err := m1kube.CoreV1().Nodes().Patch(ctx, "m2", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}},
		{"evict a pod (only the coordinator on a server drains)", func(ctx context.Context) error {
			return m1kube.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "any", Namespace: "default"}})
		}},
		{"grant itself a turn (write the Cluster's status)", func(ctx context.Context) error {
			c, err := adminLiken.Cluster(ctx)
			if err != nil {
				return err
			}
			c.Status.Turns = []v1alpha1.Turn{{Machine: "m1", Since: metav1.Now()}}
			_, err = m1.UpdateClusterStatus(ctx, c)
			return err
		}},
		{"watch the machines' Secrets Role by name", func(ctx context.Context) error {
			w, err := m1kube.RbacV1().Roles(v1alpha1.SecretNamespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + SecretsRole})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"take the coordinator's Lease", func(ctx context.Context) error {
			holder := "m1"
			_, err := m1kube.CoordinationV1().Leases(v1alpha1.SecretNamespace).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: v1alpha1.SecretNamespace}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
			return err
		}},
		{"change its own RBAC", func(ctx context.Context) error {
			r, err := admin.RbacV1().ClusterRoles().Get(ctx, ObjectName("m1"), metav1.GetOptions{})
			if err != nil {
				return err
			}
			r.Rules[0].ResourceNames = append(r.Rules[0].ResourceNames, "m2")
			_, err = m1kube.RbacV1().ClusterRoles().Update(ctx, r, metav1.UpdateOptions{})
			return err
		}},
	}
	for _, d := range denied {
		err := d.do(ctx)
		if !apierrors.IsForbidden(err) {
			t.Errorf("machine m1 could %s: err = %v, want Forbidden", d.name, err)
		}
	}
}

const zeros = "0000000000000000000000000000000000000000000000000000000000000000"

func restFor(t *testing.T, cfg *rest.Config) rest.Interface {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = kubeCodecs()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

func kubeCodecs() runtime.NegotiatedSerializer {
	return serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(kube.Scheme)}
}

// TestServerCoordinatorRights proves what the coordinator's roles give a server machine's
// certificate, and what they still do not: an operator's approval and other machines'
// status stay out of reach.
func TestServerCoordinatorRights(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	adminLiken, err := kube.NewClient(env.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, admin, "s9", "a9"); err != nil {
		t.Fatal(err)
	}
	if err := InstallServers(ctx, admin, "s9"); err != nil {
		t.Fatal(err)
	}
	if err := InstallServers(ctx, admin, "s9"); err != nil { // idempotent
		t.Fatal(err)
	}
	if _, err := adminLiken.Cluster(ctx); apierrors.IsNotFound(err) {
		if _, err := adminLiken.CreateCluster(ctx, cluster()); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"s9", "a9"} {
		if _, err := adminLiken.CreateMachine(ctx, machine(n)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := env.UserConfig(User("s9"), Group)
	if err != nil {
		t.Fatal(err)
	}
	skube := kubernetes.NewForConfigOrDie(cfg)
	s9, err := kube.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []struct {
		name string
		do   func(context.Context) error
	}{
		{"list every Machine", func(ctx context.Context) error { _, err := s9.Machines(ctx); return err }},
		{"write the Cluster's status", func(ctx context.Context) error {
			c, err := s9.Cluster(ctx)
			if err != nil {
				return err
			}
			c.Status.Coordinator = "s9"
			_, err = s9.UpdateClusterStatus(ctx, c)
			return err
		}},
		{"cordon an agent's Node", func(ctx context.Context) error {
			_, err := skube.CoreV1().Nodes().Patch(ctx, "a9", types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
			return err
		}},
		{"list the pods on a Node", func(ctx context.Context) error {
			_, err := skube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=a9"})
			return err
		}},
		{"watch the machines' Secrets Role by name", func(ctx context.Context) error {
			w, err := skube.RbacV1().Roles(v1alpha1.SecretNamespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + SecretsRole})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"take the coordinator's Lease", func(ctx context.Context) error {
			holder := "s9"
			_, err := skube.CoordinationV1().Leases(v1alpha1.SecretNamespace).Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: LeaseName, Namespace: v1alpha1.SecretNamespace}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
			return err
		}},
	}
	for _, a := range allowed {
		if err := a.do(ctx); err != nil {
			t.Errorf("server s9 cannot %s: %v", a.name, err)
		}
	}
	// Eviction of a pod that does not exist: allowed by RBAC, so the answer is NotFound.
	err = skube.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "nosuch", Namespace: "default"}})
	if !apierrors.IsNotFound(err) {
		t.Errorf("server s9 evicting a pod: err = %v, want NotFound (allowed, no such pod)", err)
	}
	denied := []struct {
		name string
		do   func(context.Context) error
	}{
		{"approve a reboot", func(ctx context.Context) error {
			_, err := s9.PatchMachine(ctx, "a9", []byte(`{"spec":{"reboot":{"approval":{"pendingHash":"sha256:`+zeros+`"}}}}`))
			return err
		}},
		{"write another machine's status", func(ctx context.Context) error {
			m, err := adminLiken.Machine(ctx, "a9")
			if err != nil {
				return err
			}
			_, err = s9.UpdateMachineStatus(ctx, m)
			return err
		}},
		{"change the Cluster's spec", func(ctx context.Context) error {
			c, err := adminLiken.Cluster(ctx)
			if err != nil {
				return err
			}
			c.Spec.RebootPolicy = v1alpha1.RebootAuto
			_, err = s9.UpdateCluster(ctx, c)
			return err
		}},
		{"list the Roles in liken-system", func(ctx context.Context) error {
			_, err := skube.RbacV1().Roles(v1alpha1.SecretNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"read Secrets elsewhere", func(ctx context.Context) error {
			_, err := skube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{})
			return err
		}},
	}
	for _, d := range denied {
		if err := d.do(ctx); !apierrors.IsForbidden(err) {
			t.Errorf("server s9 could %s: err = %v, want Forbidden", d.name, err)
		}
	}
}

// requestCounter counts the requests sent through a client config, watches apart, by
// method and path.
type requestCounter struct {
	mu   sync.Mutex
	sent []string
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Query().Get("watch") != "true" {
			c.mu.Lock()
			c.sent = append(c.sent, r.Method+" "+r.URL.Path)
			c.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (c *requestCounter) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sent[n:])
}

func (c *requestCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// secretsRoleNames are the Secrets SecretsRole allows, read as admin.
func secretsRoleNames(t *testing.T, admin kubernetes.Interface) []string {
	t.Helper()
	r, err := admin.RbacV1().Roles(v1alpha1.SecretNamespace).Get(t.Context(), SecretsRole, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rule := range r.Rules {
		names = append(names, rule.ResourceNames...)
	}
	return names
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return ok(), nil }); err != nil {
		t.Fatalf("%s never happened", what)
	}
}

// TestSecretsRoleKeeper: with a server's credentials, the keeper makes SecretsRole allow
// the Secrets named; asked again with the same names it sends no request at all (it
// answers from its watch), and an edit of the Role by someone else is seen and undone.
func TestSecretsRoleKeeper(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	if err := Install(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := InstallServers(ctx, admin, "keeper1"); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.UserConfig(User("keeper1"), Group)
	if err != nil {
		t.Fatal(err)
	}
	var sent requestCounter
	cfg.Wrap(sent.wrap)
	var changes atomic.Int32
	k := NewSecretsRoleKeeper(kubernetes.NewForConfigOrDie(cfg), nil, func() { changes.Add(1) })
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitUntil(t, "the keeper's watch listing the Role", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.synced != nil && k.synced()
	})
	sync := func(names ...string) bool {
		t.Helper()
		changed, err := k.Sync(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	// What the keeper's watch shows; a Sync before it shows the keeper's last write
	// conflicts and changes nothing, and the watch's news has it asked again.
	watched := func(names ...string) func() bool {
		return func() bool {
			o, ok, _ := k.store.GetByKey(v1alpha1.SecretNamespace + "/" + SecretsRole)
			return ok && equality.Semantic.DeepEqual(o.(*rbacv1.Role).Rules, RegistrySecretRules(names))
		}
	}
	sync() // whatever an earlier test left: no rule
	waitUntil(t, "the watch showing the Role without rules", watched())
	if changed := sync("registry-a", "registry-b"); !changed {
		t.Error("naming two Secrets did not change the Role")
	}
	if got := secretsRoleNames(t, admin); !slices.Equal(got, []string{"registry-a", "registry-b"}) {
		t.Fatalf("the Role allows %v; want registry-a, registry-b", got)
	}
	// Once the watch has brought the Role written, asking again sends nothing.
	waitUntil(t, "the watch showing the Role written", watched("registry-a", "registry-b"))
	before := sent.count()
	for range 50 {
		if sync("registry-a", "registry-b") {
			t.Fatal("the Role changed when asked for what it allows")
		}
	}
	if got := sent.since(before); len(got) > 0 {
		t.Errorf("asked 50 times for what the Role allows, the keeper sent %v; want nothing", got)
	}
	// An operator's edit: the keeper is told, and the next Sync puts the Role back.
	seen := changes.Load()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		r, err := admin.RbacV1().Roles(v1alpha1.SecretNamespace).Get(ctx, SecretsRole, metav1.GetOptions{})
		if err != nil {
			return err
		}
		r.Rules = RegistrySecretRules([]string{"registry-a", "everything-else"})
		_, err = admin.RbacV1().Roles(v1alpha1.SecretNamespace).Update(ctx, r, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the keeper told of the edit", func() bool { return changes.Load() > seen })
	if !sync("registry-a", "registry-b") {
		t.Error("the keeper did not undo an edit of the Role")
	}
	if got := secretsRoleNames(t, admin); !slices.Equal(got, []string{"registry-a", "registry-b"}) {
		t.Errorf("after the edit was undone the Role allows %v; want registry-a, registry-b", got)
	}
	waitUntil(t, "the watch showing the Role put back", watched("registry-a", "registry-b"))
	sync()
	if got := secretsRoleNames(t, admin); len(got) != 0 {
		t.Errorf("no Secret named, the Role allows %v", got)
	}
}

// TestSecretsRoleKeeperWithoutWatch: a server whose RBAC comes from a layer built before the
// keeper may get and update SecretsRole but not list or watch it. The keeper stops asking
// to watch after the first refusal, reads the Role once and then only when the names
// change.
func TestSecretsRoleKeeperWithoutWatch(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	if err := Install(ctx, admin); err != nil {
		t.Fatal(err)
	}
	const user = "liken:machine:older-server"
	old := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "older-coordinator", Namespace: v1alpha1.SecretNamespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
			{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles"}, ResourceNames: []string{SecretsRole}, Verbs: []string{"get", "update"}},
		}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: old.Name, Namespace: old.Namespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: old.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: "rbac.authorization.k8s.io", Name: user}}}
	if err := applyRole(ctx, admin, old, binding); err != nil {
		t.Fatal(err)
	}
	cfg, err := env.UserConfig(user, Group)
	if err != nil {
		t.Fatal(err)
	}
	var sent requestCounter
	cfg.Wrap(sent.wrap)
	k := NewSecretsRoleKeeper(kubernetes.NewForConfigOrDie(cfg), nil, nil)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-done: // the keeper's watch ends at the refusal
	case <-time.After(30 * time.Second):
		t.Fatal("the keeper's watch did not stop when it was refused")
	}
	if !k.refused.Load() {
		t.Fatal("the keeper stopped its watch without a refusal")
	}
	// The refusal a second ago was the one list: the reflector would have tried again
	// within a second.
	time.Sleep(2 * time.Second)
	lists := 0
	for _, r := range sent.since(0) {
		if r == "GET /apis/rbac.authorization.k8s.io/v1/namespaces/"+v1alpha1.SecretNamespace+"/roles" {
			lists++
		}
	}
	if lists != 1 {
		t.Errorf("the keeper listed the Role %d times; want once, refused", lists)
	}
	sync := func(names ...string) bool {
		t.Helper()
		changed, err := k.Sync(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	sync()
	sync("registry-c")
	if got := secretsRoleNames(t, admin); !slices.Equal(got, []string{"registry-c"}) {
		t.Fatalf("the Role allows %v; want registry-c", got)
	}
	before := sent.count()
	for range 20 {
		sync("registry-c")
	}
	if got := sent.since(before); len(got) > 0 {
		t.Errorf("asked 20 times for the names it was last given, the keeper sent %v; want nothing", got)
	}
	if !sync("registry-d") {
		t.Error("naming another Secret did not change the Role")
	}
	if got := secretsRoleNames(t, admin); !slices.Equal(got, []string{"registry-d"}) {
		t.Errorf("the Role allows %v; want registry-d", got)
	}
	sync()
}
