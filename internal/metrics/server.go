// Package metrics serves a machine's Prometheus metrics to the cluster the way a kubelet
// serves its own: over TLS on the node's addresses, every request authenticated and
// authorized by the API server: a TokenReview for its bearer token, then a
// SubjectAccessReview for `get` on the non-resource URL `/metrics`, with answers cached as
// the kubelet caches them. Who may scrape is the cluster's own RBAC; the API server decides,
// this package only asks it. The reviews go through client-go, not k8s.io/apiserver's
// delegating authenticator and authorizer (what the kubelet and controller-runtime's filter
// use): those took liken-agent from 46.6 to 90.6 MB (OpenTelemetry, gRPC and CEL came with
// them), in every image, paged in at every boot.
package metrics

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"liken.dev/liken/internal/pki"
)

// Path is where the metrics are served.
const Path = "/metrics"

// Options configure a Server.
type Options struct {
	// Addr is the address to listen on, such as ":9470".
	Addr string
	// Gatherer holds the metrics.
	Gatherer prometheus.Gatherer
	// Kube reviews tokens and access (its identity needs create on tokenreviews and
	// subjectaccessreviews: authority.MachineRBAC grants it).
	Kube kubernetes.Interface
	// Name and IPs go into the serving certificate (the node's name and addresses).
	Name string
	IPs  []net.IP
	Log  *slog.Logger
}

// Server is a running metrics endpoint.
type Server struct {
	srv *http.Server
	l   net.Listener
	// CertPEM is the serving certificate (made for this run: scrapers skip its
	// verification, as for controller-runtime's self-signed default, and authenticate
	// themselves with their token).
	CertPEM []byte
}

// Start listens on o.Addr and serves until Close.
func Start(o Options) (*Server, error) {
	if o.Gatherer == nil || o.Kube == nil {
		return nil, errors.New("metrics: a gatherer and an API client are required")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	rv := &reviewer{kube: o.Kube, cache: map[string]cached{}}
	cert, err := servingCert(o.Name, o.IPs)
	if err != nil {
		return nil, err
	}
	metrics := promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.Handle(Path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "Unauthorized: a bearer token the API server accepts is required", http.StatusUnauthorized)
			return
		}
		user, err := rv.authenticate(r.Context(), token)
		if err != nil {
			o.Log.Info("metrics: a scrape not authenticated", "from", r.RemoteAddr, "err", err)
			http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		allowed, reason, err := rv.authorize(r.Context(), user, verb, r.URL.Path)
		if err != nil || !allowed {
			msg := fmt.Sprintf("Forbidden: %s may not %s %s (RBAC: nonResourceURLs [%q], verb get)", user.Username, verb, r.URL.Path, Path)
			if reason != "" {
				msg += ": " + reason
			}
			if err != nil {
				o.Log.Info("metrics: a scrape not authorized", "user", user.Username, "err", err)
				msg += ": " + err.Error()
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		metrics.ServeHTTP(w, r)
	}))
	l, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listening on %s: %w", o.Addr, err)
	}
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("metrics: the serving certificate: %w", err)
	}
	s := &Server{l: l, CertPEM: cert.CertPEM, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}}
	go s.srv.ServeTLS(l, "", "")
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Close stops the server.
func (s *Server) Close(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// servingCert is a certificate for name and ips from an authority made for this run.
func servingCert(name string, ips []net.IP) (pki.Pair, error) {
	if name == "" {
		name = "liken-agent"
	}
	ca, err := pki.NewCA("liken-agent-metrics-ca@"+name, 365*24*time.Hour)
	if err != nil {
		return pki.Pair{}, fmt.Errorf("metrics: %w", err)
	}
	p, err := ca.ServingCert(name, []string{name, "localhost"}, append([]net.IP{net.IPv4(127, 0, 0, 1)}, ips...), 365*24*time.Hour)
	if err != nil {
		return pki.Pair{}, fmt.Errorf("metrics: %w", err)
	}
	return p, nil
}

// How long answers are kept: the kubelet's defaults (--authentication-token-webhook-cache-ttl,
// --authorization-webhook-cache-authorized-ttl and -unauthorized-ttl). A failed review (the
// API server unreachable) is not kept.
const (
	tokenTTL   = 2 * time.Minute
	allowTTL   = 5 * time.Minute
	denyTTL    = 30 * time.Second
	maxEntries = 1024
)

// reviewer asks the API server who a token is and what they may do, and remembers the
// answers a while.
type reviewer struct {
	kube  kubernetes.Interface
	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	until   time.Time
	user    authenticationv1.UserInfo
	ok      bool
	message string
}

func (rv *reviewer) get(key string) (cached, bool) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	c, ok := rv.cache[key]
	if !ok || time.Now().After(c.until) {
		return cached{}, false
	}
	return c, true
}

func (rv *reviewer) put(key string, c cached) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if len(rv.cache) >= maxEntries {
		now := time.Now()
		for k, v := range rv.cache {
			if now.After(v.until) {
				delete(rv.cache, k)
			}
		}
		if len(rv.cache) >= maxEntries {
			clear(rv.cache) // many scrapers at once: start again rather than grow
		}
	}
	rv.cache[key] = c
}

// authenticate is who the API server says token belongs to (a TokenReview for the API
// server's own audiences, as for a request to it).
func (rv *reviewer) authenticate(ctx context.Context, token string) (authenticationv1.UserInfo, error) {
	sum := sha256.Sum256([]byte(token)) // the cache keeps no token
	key := fmt.Sprintf("token:%x", sum)
	if c, ok := rv.get(key); ok {
		if !c.ok {
			return authenticationv1.UserInfo{}, errors.New(c.message)
		}
		return c.user, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tr, err := rv.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, fmt.Errorf("asking the API server about the token: %w", err)
	}
	if !tr.Status.Authenticated {
		msg := "the API server does not accept the token"
		if tr.Status.Error != "" {
			msg += ": " + tr.Status.Error
		}
		rv.put(key, cached{until: time.Now().Add(denyTTL), message: msg})
		return authenticationv1.UserInfo{}, errors.New(msg)
	}
	rv.put(key, cached{until: time.Now().Add(tokenTTL), user: tr.Status.User, ok: true})
	return tr.Status.User, nil
}

// authorize is whether the API server lets user verb path (a SubjectAccessReview of a
// non-resource URL), and its reason.
func (rv *reviewer) authorize(ctx context.Context, user authenticationv1.UserInfo, verb, path string) (bool, string, error) {
	groups := slices.Clone(user.Groups)
	slices.Sort(groups)
	key := fmt.Sprintf("access:%q %q %q %q %q", user.Username, user.UID, strings.Join(groups, ","), verb, path)
	if c, ok := rv.get(key); ok {
		return c.ok, c.message, nil
	}
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sar, err := rv.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("asking the API server about access: %w", err)
	}
	allowed := sar.Status.Allowed && !sar.Status.Denied
	ttl := allowTTL
	if !allowed {
		ttl = denyTTL
	}
	rv.put(key, cached{until: time.Now().Add(ttl), ok: allowed, message: sar.Status.Reason})
	return allowed, sar.Status.Reason, nil
}
