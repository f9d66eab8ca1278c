// Package authority defines what a machine's own credentials may do in the API, and makes
// those credentials. A machine authenticates as user liken:machine:<name> in group
// liken:machines with a client certificate signed by the cluster's client CA. It is not the
// kubelet's system:node:<name> identity: NodeRestriction forbids a node to change its own
// taints and many labels, which liken must manage.
//
// Every machine gets a ClusterRole and ClusterRoleBinding of its own whose rules name its
// own Machine and Node, so it can read the Cluster, its own Machine and the registry
// Secrets, and write only its own Machine's status and its own Node: never another
// machine's, never any spec (where approvals live).
package authority

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"liken.dev/liken/api/v1alpha1"
)

const (
	// Group every machine's identity belongs to.
	Group = "liken:machines"
	// userPrefix + machine name is a machine's user name.
	userPrefix = "liken:machine:"
	// EventNamespace is where machines record Events about their cluster-scoped Machine
	// (the namespace the API server itself uses for cluster-scoped objects' events).
	EventNamespace = "default"
)

// User returns a machine's user name.
func User(machine string) string { return userPrefix + machine }

// ObjectName is the name of a machine's ClusterRole and ClusterRoleBinding.
func ObjectName(machine string) string { return "liken:machine:" + machine }

// MachineRBAC returns the ClusterRole and ClusterRoleBinding for one machine.
func MachineRBAC(machine string) (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	g := v1alpha1.GroupVersion.Group
	labels := map[string]string{"app.kubernetes.io/managed-by": "liken", "liken.dev/machine": machine}
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(machine), Labels: labels},
		Rules: []rbacv1.PolicyRule{
			// Reads, by name only: list and watch are allowed with a metadata.name field
			// selector naming the object.
			{APIGroups: []string{g}, Resources: []string{"machines"}, ResourceNames: []string{machine}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{g}, Resources: []string{"clusters"}, ResourceNames: []string{v1alpha1.ClusterName}, Verbs: []string{"get", "list", "watch"}},
			// Its own status, nothing else of its own Machine.
			{APIGroups: []string{g}, Resources: []string{"machines/status"}, ResourceNames: []string{machine}, Verbs: []string{"get", "update", "patch"}},
			// Its own Node: labels, taints, cordon.
			{APIGroups: []string{""}, Resources: []string{"nodes"}, ResourceNames: []string{machine}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			// Its metrics endpoint asks the API server who a scraper is and whether it may
			// read them, as a kubelet does (internal/metrics): the rights of
			// system:auth-delegator.
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
			{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: ObjectName(machine), Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: "rbac.authorization.k8s.io", Name: User(machine)}},
	}
	return role, binding
}

// Coordinator role names: what the reboot coordinator may do, bound to each server
// machine's user. A server holds the cluster's datastore and CAs, so these rights give it
// nothing it could not take; agents never get them, so an agent machine's credential
// can cordon only its own Node and evict nothing: the coordinator drains for it.
const (
	CoordinatorRole = "liken:coordinator"
	// LeaseName is the Lease that elects one coordinator, in liken-system.
	LeaseName = "liken-coordinator"
)

// CoordinatorRBAC returns the coordinator's ClusterRole (read machines and the Cluster,
// write the Cluster's status, cordon Nodes, evict pods) and its Role for the leader
// election Lease in liken-system.
func CoordinatorRBAC() (*rbacv1.ClusterRole, *rbacv1.Role) {
	g := v1alpha1.GroupVersion.Group
	labels := map[string]string{"app.kubernetes.io/managed-by": "liken"}
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: CoordinatorRole, Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{g}, Resources: []string{"machines", "clusters"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{g}, Resources: []string{"clusters/status"}, ResourceNames: []string{v1alpha1.ClusterName}, Verbs: []string{"get", "update", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
			// Drains: list a node's pods, evict them (the eviction API honours
			// PodDisruptionBudgets); delete only when drain.force is set.
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
			{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list"}},
			// Gates: the workloads that ran on a machine (a pod's ReplicaSet names its
			// Deployment) and those a gate selects are back; a Job gate runs a Job made from
			// a CronJob's template. A server holds the cluster's CAs already, so making Jobs
			// gives it nothing new.
			{APIGroups: []string{"apps"}, Resources: []string{"replicasets"}, Verbs: []string{"get"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"batch"}, Resources: []string{"cronjobs"}, Verbs: []string{"get"}},
			{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "create"}},
			{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"get", "list"}},
			// A server's network trial commits only once another machine's kubelet has renewed
			// its Lease through it (internal/agent peersReach).
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get"}},
		},
	}
	lease := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: CoordinatorRole, Namespace: v1alpha1.SecretNamespace, Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{LeaseName}, Verbs: []string{"get", "update", "patch"}},
			// The coordinator keeps SecretsRole naming the Cluster's registry Secrets. RBAC lets
			// it grant only what it holds itself, so it reads every Secret here: a server
			// holds the cluster's CAs and datastore already, so this gives it nothing new.
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
			// It keeps the Role from a watch (SecretsRoleKeeper): list and watch by name.
			{APIGroups: []string{"rbac.authorization.k8s.io"}, Resources: []string{"roles"}, ResourceNames: []string{SecretsRole}, Verbs: []string{"get", "list", "watch", "update"}},
		},
	}
	return role, lease
}

// ServerRBAC binds a server machine's user to the coordinator's roles.
func ServerRBAC(machine string) (*rbacv1.ClusterRoleBinding, *rbacv1.RoleBinding) {
	labels := map[string]string{"app.kubernetes.io/managed-by": "liken", "liken.dev/machine": machine}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: "rbac.authorization.k8s.io", Name: User(machine)}}
	name := "liken:coordinator:" + machine
	return &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: CoordinatorRole},
			Subjects:   subjects,
		}, &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.SecretNamespace, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: CoordinatorRole},
			Subjects:   subjects,
		}
}

// SecretsRole is the Role in liken-system that lets every machine read the registry Secrets
// the Cluster names, and only those: its rules name them, and the coordinator keeps the
// names in step with the Cluster (SyncRegistrySecrets). It starts with no rule.
const SecretsRole = "liken:machines:secrets"

// RegistrySecretRules are SecretsRole's rules for the Secrets named: get, by name. None
// named, no rule (a rule without names would allow every Secret).
func RegistrySecretRules(names []string) []rbacv1.PolicyRule {
	if len(names) == 0 {
		return nil
	}
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: append([]string(nil), names...), Verbs: []string{"get"}}}
}

// SyncRegistrySecrets makes SecretsRole allow exactly the Secrets named, from a read of the
// Role: for a one-off change. The coordinator, which asks on every change it sees in the
// fleet, keeps the Role with a SecretsRoleKeeper instead. It reports whether it changed the
// Role.
func SyncRegistrySecrets(ctx context.Context, kube kubernetes.Interface, names []string) (bool, error) {
	r, err := kube.RbacV1().Roles(v1alpha1.SecretNamespace).Get(ctx, SecretsRole, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading Role %s: %w", SecretsRole, err)
	}
	return updateSecretsRole(ctx, kube, r, names)
}

// updateSecretsRole writes r with the rules for names, unless it has them already.
func updateSecretsRole(ctx context.Context, kube kubernetes.Interface, r *rbacv1.Role, names []string) (bool, error) {
	want := RegistrySecretRules(names)
	if equality.Semantic.DeepEqual(r.Rules, want) {
		return false, nil
	}
	r = r.DeepCopy() // r may be a cache's
	r.Rules = want
	if _, err := kube.RbacV1().Roles(v1alpha1.SecretNamespace).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating Role %s: %w", SecretsRole, err)
	}
	return true, nil
}

// SecretsRoleKeeper keeps SecretsRole allowing exactly the Secrets named, reading the Role
// from a watch: asked while the Role is as wanted, it sends no request, so it may be asked
// on every change in the fleet (a loop that read the Role each time made a thousand-machine
// coordinator read it twenty times a second). A server whose RBAC comes from a layer built
// before the keeper may get and update the Role but not watch it: then the keeper reads it
// once, and again only when the names change.
type SecretsRoleKeeper struct {
	kube     kubernetes.Interface
	log      *slog.Logger
	onChange func()

	store  cache.Store
	synced cache.InformerSynced
	// refused: the API server refused to list the Role (RBAC from an older layer).
	refused atomic.Bool

	mu sync.Mutex
	// read are the names the Role was last read with or made to allow, when the watch is
	// not to be trusted; readOK says there was such a read.
	read   []string
	readOK bool
}

// NewSecretsRoleKeeper makes a keeper; Run starts its watch. onChange (nil: none) is called
// on every change the watch sees, so the caller asks again and an edit of the Role by
// anyone else is undone.
func NewSecretsRoleKeeper(kube kubernetes.Interface, log *slog.Logger, onChange func()) *SecretsRoleKeeper {
	if log == nil {
		log = slog.Default()
	}
	if onChange == nil {
		onChange = func() {}
	}
	return &SecretsRoleKeeper{kube: kube, log: log, onChange: onChange}
}

// Run watches the Role until ctx ends, or until the API server refuses to let it: then
// Sync reads the Role when the names change.
func (k *SecretsRoleKeeper) Run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rc := k.kube.RbacV1().RESTClient()
	sel := fields.OneTermEqualSelector("metadata.name", SecretsRole).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			out := &rbacv1.RoleList{}
			err := rc.Get().Namespace(v1alpha1.SecretNamespace).Resource("roles").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
			if apierrors.IsForbidden(err) {
				// The reflector would try again every half minute, forever: RBAC from an
				// older layer does not change while this server runs.
				k.refused.Store(true)
				k.log.Info("this server may not watch Role "+SecretsRole+" (RBAC from an older layer): it is read when the Cluster's registry Secrets change", "err", err)
				cancel()
			}
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			opts.Watch = true
			return rc.Get().Namespace(v1alpha1.SecretNamespace).Resource("roles").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
		},
	}
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &rbacv1.Role{},
		Handler: cache.ResourceEventHandlerFuncs{AddFunc: func(any) { k.onChange() }, UpdateFunc: func(any, any) { k.onChange() }, DeleteFunc: func(any) { k.onChange() }}})
	k.mu.Lock()
	k.store, k.synced = store, ctrl.HasSynced
	k.mu.Unlock()
	ctrl.RunWithContext(ctx)
}

// Sync makes the Role allow exactly the Secrets named, and reports whether it changed it.
// From the watch, it writes only when the Role's rules differ; before the watch has listed
// the Role, or where it may not, it reads the Role when the names differ from those of its
// last read.
func (k *SecretsRoleKeeper) Sync(ctx context.Context, names []string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.synced != nil && k.synced() && !k.refused.Load() {
		o, ok, err := k.store.GetByKey(v1alpha1.SecretNamespace + "/" + SecretsRole)
		if err != nil {
			return false, fmt.Errorf("reading Role %s from the watch: %w", SecretsRole, err)
		}
		if !ok {
			return false, fmt.Errorf("keeping Role %s/%s: it does not exist (the server layer's RBAC makes it)", v1alpha1.SecretNamespace, SecretsRole)
		}
		changed, err := updateSecretsRole(ctx, k.kube, o.(*rbacv1.Role), names)
		if apierrors.IsConflict(err) {
			// The watch is behind a write (this keeper's own, a moment ago): it brings the
			// Role written, onChange has the caller ask again, and that Sync compares anew.
			return false, nil
		}
		return changed, err
	}
	if k.readOK && slices.Equal(k.read, names) {
		return false, nil
	}
	changed, err := SyncRegistrySecrets(ctx, k.kube, names)
	if err != nil {
		return false, err
	}
	k.read, k.readOK = slices.Clone(names), true
	return changed, nil
}

// SharedRBAC returns what every machine may do: read the registry Secrets the Cluster names
// in liken-system (SecretsRole, no rule until the coordinator names them) and record Events.
func SharedRBAC() ([]*rbacv1.Role, []*rbacv1.RoleBinding) {
	labels := map[string]string{"app.kubernetes.io/managed-by": "liken"}
	roles := []*rbacv1.Role{{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: SecretsRole, Namespace: v1alpha1.SecretNamespace, Labels: labels},
	}, {
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: "liken:machines:events", Namespace: EventNamespace, Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
			{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
		},
	}}
	var bindings []*rbacv1.RoleBinding
	for _, r := range roles {
		bindings = append(bindings, &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: r.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: "rbac.authorization.k8s.io", Name: Group}},
		})
	}
	return roles, bindings
}

// Install creates or updates the shared RBAC and that of each named machine, and the
// liken-system namespace.
func Install(ctx context.Context, kube kubernetes.Interface, machines ...string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SecretNamespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
	}
	roles, bindings := SharedRBAC()
	for i := range roles {
		if err := applyRole(ctx, kube, roles[i], bindings[i]); err != nil {
			return err
		}
	}
	for _, m := range machines {
		role, binding := MachineRBAC(m)
		if err := applyClusterRole(ctx, kube, role, binding); err != nil {
			return err
		}
	}
	return nil
}

// InstallServers creates or updates the coordinator's roles and binds each named server
// machine to them (Install makes the machines' own RBAC and the namespace first).
func InstallServers(ctx context.Context, kube kubernetes.Interface, servers ...string) error {
	role, lease := CoordinatorRBAC()
	for _, m := range servers {
		crb, rb := ServerRBAC(m)
		if err := applyClusterRole(ctx, kube, role, crb); err != nil {
			return err
		}
		if err := applyRole(ctx, kube, lease, rb); err != nil {
			return err
		}
	}
	return nil
}

// applyRole creates or updates a namespaced Role and its binding.
func applyRole(ctx context.Context, kube kubernetes.Interface, r *rbacv1.Role, b *rbacv1.RoleBinding) error {
	if err := upsert(ctx, r.Name, func() error {
		_, err := kube.RbacV1().Roles(r.Namespace).Create(ctx, r, metav1.CreateOptions{})
		return err
	}, func() error {
		if r.Name == SecretsRole {
			// Its rules are the coordinator's (SyncRegistrySecrets): left as they are.
			return nil
		}
		_, err := kube.RbacV1().Roles(r.Namespace).Update(ctx, r, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	return upsert(ctx, b.Name, func() error {
		_, err := kube.RbacV1().RoleBindings(b.Namespace).Create(ctx, b, metav1.CreateOptions{})
		return err
	}, func() error {
		_, err := kube.RbacV1().RoleBindings(b.Namespace).Update(ctx, b, metav1.UpdateOptions{})
		return err
	})
}

// applyClusterRole creates or updates a ClusterRole and its binding.
func applyClusterRole(ctx context.Context, kube kubernetes.Interface, r *rbacv1.ClusterRole, b *rbacv1.ClusterRoleBinding) error {
	if err := upsert(ctx, r.Name, func() error {
		_, err := kube.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{})
		return err
	}, func() error {
		_, err := kube.RbacV1().ClusterRoles().Update(ctx, r, metav1.UpdateOptions{})
		return err
	}); err != nil {
		return err
	}
	return upsert(ctx, b.Name, func() error {
		_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
		return err
	}, func() error {
		_, err := kube.RbacV1().ClusterRoleBindings().Update(ctx, b, metav1.UpdateOptions{})
		return err
	})
}

// upsert creates an object, or updates it when it exists. RBAC objects need no
// resourceVersion on update.
func upsert(ctx context.Context, name string, create, update func() error) error {
	err := create()
	if apierrors.IsAlreadyExists(err) {
		err = update()
	}
	if err != nil {
		return fmt.Errorf("installing RBAC %s: %w", name, err)
	}
	return nil
}

// BootstrapUser is the user of the bootstrap credential servers carry: it creates the
// Cluster and the Machines from the layer when they are absent (internal/bootstrap).
const BootstrapUser = "liken:bootstrap"

// BootstrapRBAC is all the bootstrap credential may do: create the Cluster and Machines
// (never update or delete them: after bootstrap the API is authoritative), read and create
// the ConfigMaps in liken-system that record what was bootstrapped (so a deleted Machine is
// not made again), and record Events.
func BootstrapRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, []*rbacv1.Role, []*rbacv1.RoleBinding) {
	g := v1alpha1.GroupVersion.Group
	labels := map[string]string{"app.kubernetes.io/managed-by": "liken"}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: "rbac.authorization.k8s.io", Name: BootstrapUser}}
	roles := []*rbacv1.Role{{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: BootstrapUser, Namespace: EventNamespace, Labels: labels},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}},
	}, {
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: BootstrapUser, Namespace: v1alpha1.SecretNamespace, Labels: labels},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create"}}},
	}}
	var bindings []*rbacv1.RoleBinding
	for _, r := range roles {
		bindings = append(bindings, &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: BootstrapUser, Namespace: r.Namespace, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: BootstrapUser},
			Subjects:   subjects,
		})
	}
	return &rbacv1.ClusterRole{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
			ObjectMeta: metav1.ObjectMeta{Name: BootstrapUser, Labels: labels},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{g}, Resources: []string{"clusters", "machines"}, Verbs: []string{"create"}}},
		}, &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: BootstrapUser, Labels: labels},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: BootstrapUser},
			Subjects:   subjects,
		}, roles, bindings
}

// InstallBootstrap creates or updates the bootstrap credential's RBAC (k3s applies it from
// the server layer's manifests; tests install it directly).
func InstallBootstrap(ctx context.Context, kube kubernetes.Interface) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SecretNamespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	cr, crb, roles, bindings := BootstrapRBAC()
	if err := applyClusterRole(ctx, kube, cr, crb); err != nil {
		return err
	}
	for i := range roles {
		if err := applyRole(ctx, kube, roles[i], bindings[i]); err != nil {
			return err
		}
	}
	return nil
}
