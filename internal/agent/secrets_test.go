package agent

import (
	"context"

	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
)

// TestMachineReadsOnlyNamedSecrets: with a machine's own credential, against the real API
// server, only the registry Secrets the Cluster names can be read (once the coordinator has
// named them in the machines' Role); another Secret in liken-system, and listing them, is
// refused, and a Secret the Cluster stops naming is refused again.
func TestMachineReadsOnlyNamedSecrets(t *testing.T) {
	f := setup(t, map[string]v1alpha1.Role{"sec1": v1alpha1.RoleAgent})
	ctx := t.Context()
	for _, n := range []string{"registry-auth", "unrelated"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: v1alpha1.SecretNamespace},
			StringData: map[string]string{"username": "u", "password": "p"}}
		if _, err := f.admin.CoreV1().Secrets(v1alpha1.SecretNamespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			f.admin.CoreV1().Secrets(v1alpha1.SecretNamespace).Delete(context.Background(), n, metav1.DeleteOptions{})
		})
	}
	old, err := f.liken.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f.restoreCluster(t, func(c *v1alpha1.Cluster) { c.Spec.Registries = old.Spec.Registries })
	f.editCluster(func(c *v1alpha1.Cluster) {
		c.Spec.Registries = &v1alpha1.Registries{Configs: []v1alpha1.RegistryConfig{{Host: "registry.example.com", AuthSecret: &v1alpha1.SecretReference{Name: "registry-auth"}}}}
	})
	cfg, err := env.UserConfig(authority.User("sec1"), authority.Group)
	if err != nil {
		t.Fatal(err)
	}
	machine := kubernetes.NewForConfigOrDie(cfg)
	secrets := machine.CoreV1().Secrets(v1alpha1.SecretNamespace)
	waitCount(t, "the named Secret readable", func() bool {
		_, err := secrets.Get(ctx, "registry-auth", metav1.GetOptions{})
		return err == nil
	})
	if _, err := secrets.Get(ctx, "unrelated", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a Secret the Cluster does not name: %v; want Forbidden", err)
	}
	if _, err := secrets.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing the Secrets: %v; want Forbidden", err)
	}
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Registries = nil })
	waitCount(t, "the Secret no longer named refused", func() bool {
		_, err := secrets.Get(ctx, "registry-auth", metav1.GetOptions{})
		return apierrors.IsForbidden(err)
	})
}
