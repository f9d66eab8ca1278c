package apiserver

import (
	"context"
	"net/http"
	"slices"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// RequestLog records the API requests sent through a client config (rest.Config.Wrap with
// Wrap), but for the watches and the reads and renewals of one Lease (LeasePath): a watch
// stays open, and an election renews its Lease every RetryPeriod by design. Everything else
// an idle component sends is a loop that reads or writes for nothing: the idle tests fail on
// it.
type RequestLog struct {
	// LeasePath is the election Lease's URL path, whose GETs and PUTs count as renewals.
	LeasePath string

	mu       sync.Mutex
	requests []string
	renewals int
}

// Wrap records what goes through rt.
func (l *RequestLog) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		switch {
		case r.URL.Query().Get("watch") == "true":
		case r.URL.Path == l.LeasePath && (r.Method == http.MethodGet || r.Method == http.MethodPut):
			l.renewals++
		default:
			l.requests = append(l.requests, r.Method+" "+r.URL.RequestURI())
		}
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

// Mark is where the log stands: Since and RenewedSince count from it.
func (l *RequestLog) Mark() (requests, renewals int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.requests), l.renewals
}

// Since are the requests recorded after the mark requests.
func (l *RequestLog) Since(requests int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.requests[requests:])
}

// RenewedSince counts the Lease requests after the mark renewals.
func (l *RequestLog) RenewedSince(renewals int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewals - renewals
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Heartbeat reports a Node's status again as its kubelet does with nothing changed: the
// same status, a new heartbeat time. The idle tests use it to make components plan again.
func Heartbeat(ctx context.Context, kc kubernetes.Interface, node string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kc.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			n.Status.Conditions[i].LastHeartbeatTime = metav1.Now()
		}
		_, err = kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}
