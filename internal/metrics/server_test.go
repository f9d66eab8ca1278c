package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/authority"
	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) {
	os.Exit(apiserver.Main(m, "metrics", apiserver.Options{}, &env))
}

// TestScrapeThroughTheAPIServer: the endpoint serves the metrics over TLS to a scraper
// whose token the API server accepts and whom RBAC lets get /metrics, with the machine's
// own credential (authority.MachineRBAC) doing the reviews; a token without that right is
// Forbidden, and no token, or one the API server does not know, Unauthorized.
func TestScrapeThroughTheAPIServer(t *testing.T) {
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	if err := authority.Install(ctx, admin, "m1"); err != nil {
		t.Fatal(err)
	}
	machineCfg, err := env.UserConfig(authority.User("m1"))
	if err != nil {
		t.Fatal(err)
	}
	// The reviews the endpoint asks for, by kind: the answers are kept a while.
	var mu sync.Mutex
	reviews := map[string]int{}
	machineCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			reviews[path.Base(r.URL.Path)]++
			mu.Unlock()
			return rt.RoundTrip(r)
		})
	})
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "liken_test_scrapes_total", Help: "A metric to find."})
	reg.MustRegister(c)
	c.Add(3)
	s, err := Start(Options{Addr: "127.0.0.1:0", Gatherer: reg, Kube: kubernetes.NewForConfigOrDie(machineCfg), Name: "m1", IPs: []net.IP{net.ParseIP("192.0.2.7")}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())

	// Two scrapers: prometheus may get /metrics, nobody may not.
	for _, sa := range []string{"prometheus", "nobody"} {
		if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "liken-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "liken-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "liken-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "default"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	// The certificate names the node and its address.
	block, _ := pem.Decode(s.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("m1"); err != nil {
		t.Errorf("the serving certificate does not name the node: %v", err)
	}
	if err := cert.VerifyHostname("192.0.2.7"); err != nil {
		t.Errorf("the serving certificate does not name the node's address: %v", err)
	}
	// The certificate is its own authority's: a scraper skips its verification, as
	// Prometheus does for a kubelet with insecure_skip_verify.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := "https://" + s.Addr().String() + Path
	get := func(bearer string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name, token string
		code        int
		body        string
	}{
		{"a scraper RBAC allows", token("prometheus"), http.StatusOK, "liken_test_scrapes_total 3"},
		{"a scraper RBAC does not allow", token("nobody"), http.StatusForbidden, `system:serviceaccount:default:nobody may not get /metrics`},
		{"no token", "", http.StatusUnauthorized, "Unauthorized"},
		{"a token the API server does not know", "not-a-token", http.StatusUnauthorized, "Unauthorized"},
	} {
		code, body := get(tc.token)
		if code != tc.code || !strings.Contains(body, tc.body) {
			t.Errorf("%s: %d %q; want %d with %q", tc.name, code, body, tc.code, tc.body)
		}
	}
	// Scrapes with a new token of the same scraper ask the API server once who it is, and
	// nothing more: the answers are kept (the kubelet's times: who a token is for 2 minutes,
	// a user's allowed access for 5, so this user's, allowed above, is known).
	mu.Lock()
	before := maps.Clone(reviews)
	mu.Unlock()
	prom := token("prometheus")
	for range 3 {
		if code, body := get(prom); code != http.StatusOK {
			t.Fatalf("a scrape: %d %s", code, body)
		}
	}
	mu.Lock()
	if reviews["tokenreviews"]-before["tokenreviews"] != 1 || reviews["subjectaccessreviews"]-before["subjectaccessreviews"] != 0 {
		t.Errorf("three scrapes with one new token asked for %d TokenReviews and %d SubjectAccessReviews; want 1 and 0",
			reviews["tokenreviews"]-before["tokenreviews"], reviews["subjectaccessreviews"]-before["subjectaccessreviews"])
	}
	mu.Unlock()
	// Plain HTTP is not served.
	if resp, err := http.Get("http://" + s.Addr().String() + Path); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP was served the metrics: %s", b)
		}
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
