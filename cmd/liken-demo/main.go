// Command liken-demo is the lab's demo workload (issue 26): an HTTP server that says which
// pod and node answered, and, for tests, looks a name up and fetches a URL from inside the
// cluster (its DNS, its Services, the pod network). It takes its pod's and node's names from
// the downward API (POD_NAME, NODE_NAME).
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// drainDelay is how long the demo goes on serving after SIGTERM before it closes its
// listener, as a well-behaved service does: the pod's deletion and the SIGTERM come at once,
// while the Service's endpoints reach every machine's kube-proxy only once each has synced
// its rules (seconds on a machine without KVM). A demo that stopped at once sent a client's
// connections, still routed to it, a reset: the lab's fleet upgrade lost requests that way,
// one machine's pod stopping before the other's new pod was routed to. DEMO_DRAIN
// (a Go duration) overrides it.
const drainDelay = 15 * time.Second

// insecureClient fetches from HTTPS servers without verifying their certificates (/get's
// insecure=1), one client for every such fetch so that its connections are reused.
var insecureClient = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// serviceAccountToken is where Kubernetes mounts a pod's ServiceAccount token.
const serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

func main() {
	addr := ":8080"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	drain := drainDelay
	if d, err := time.ParseDuration(os.Getenv("DEMO_DRAIN")); err == nil && d >= 0 {
		drain = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "liken-demo:", err)
		os.Exit(1)
	}
	// One line at start, so that `kubectl logs` has something to show (the lab test reads it
	// through the API server and the pod's kubelet).
	fmt.Printf("liken-demo: pod %s on node %s listening on %s\n", os.Getenv("POD_NAME"), os.Getenv("NODE_NAME"), addr)
	if err := serve(ctx, l, handler(os.Getenv), drain, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "liken-demo:", err)
		os.Exit(1)
	}
}

// serve answers on l until ctx ends, then for drain more, then closes the listener and lets
// the requests in flight finish (5 s at most).
func serve(ctx context.Context, l net.Listener, h http.Handler, drain time.Duration, log io.Writer) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		fmt.Fprintf(log, "liken-demo: stopping: serving %s more while the Service's endpoints are withdrawn\n", drain)
		time.Sleep(drain)
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	if err := srv.Serve(l); err != http.ErrServerClosed {
		return err
	}
	<-done
	return nil
}

func handler(getenv func(string) string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "liken-demo: pod %s on node %s\n", getenv("POD_NAME"), getenv("NODE_NAME"))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	// /lookup?name=NAME: the addresses the pod's resolver gives (cluster DNS).
	mux.HandleFunc("GET /lookup", func(w http.ResponseWriter, r *http.Request) {
		addrs, err := net.DefaultResolver.LookupHost(r.Context(), r.URL.Query().Get("name"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for _, a := range addrs {
			fmt.Fprintln(w, a)
		}
	})
	// /get?url=URL: what another pod or Service answers, fetched from this pod. With
	// token=serviceaccount, the request carries the pod's ServiceAccount token, as a
	// Prometheus in the cluster scrapes with its own; with insecure=1, an HTTPS server's
	// certificate is not verified, as Prometheus's insecure_skip_verify for kubelets.
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		q := r.URL.Query()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, q.Get("url"), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if q.Get("token") == "serviceaccount" {
			path := getenv("DEMO_TOKEN_FILE")
			if path == "" {
				path = serviceAccountToken
			}
			b, err := os.ReadFile(path)
			if err != nil {
				http.Error(w, "the pod's ServiceAccount token: "+err.Error(), http.StatusInternalServerError)
				return
			}
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
		}
		client := http.DefaultClient
		if q.Get("insecure") == "1" {
			client = insecureClient
		}
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 1<<20))
	})
	return mux
}
