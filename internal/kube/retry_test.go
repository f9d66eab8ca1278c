package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"liken.dev/liken/api/v1alpha1"
)

func TestPassing(t *testing.T) {
	gr := schema.GroupResource{Group: "liken.dev", Resource: "clusters"}
	refused := &url.Error{Op: "Put", URL: "https://x", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"conflict", apierrors.NewConflict(gr, "liken", fmt.Errorf("changed")), true},
		{"server timeout", apierrors.NewServerTimeout(gr, "update", 1), true},
		{"too many requests", apierrors.NewTooManyRequests("busy", 1), true},
		{"unavailable", apierrors.NewServiceUnavailable("starting"), true},
		{"client timeout", &url.Error{Op: "Put", URL: "https://x", Err: context.DeadlineExceeded}, true},
		{"connection refused", refused, true},
		{"forbidden", apierrors.NewForbidden(gr, "liken", fmt.Errorf("no")), false},
		{"invalid", apierrors.NewBadRequest("spec.version: bad"), false},
		{"not found", apierrors.NewNotFound(gr, "liken"), false},
		{"other", fmt.Errorf("the release is not pinned"), false},
	} {
		if got := Passing(c.err); got != c.want {
			t.Errorf("%s: Passing(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// TestRetryWritesAgainAfterATimeout puts a Cluster through a real HTTP server whose first
// answer to a write comes after the client's timeout, as a busy machine's API server's did.
func TestRetryWritesAgainAfterATimeout(t *testing.T) {
	var gets, puts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := v1alpha1.Cluster{TypeMeta: metav1.TypeMeta{APIVersion: "liken.dev/v1alpha1", Kind: "Cluster"}, ObjectMeta: metav1.ObjectMeta{Name: "liken", ResourceVersion: "7"}}
		switch r.Method {
		case http.MethodGet:
			gets.Add(1)
		case http.MethodPut:
			if puts.Add(1) == 1 {
				select {
				case <-time.After(2 * time.Second):
				case <-r.Context().Done():
				}
				return
			}
			if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(c)
	}))
	defer srv.Close()
	lc, err := NewClient(&rest.Config{Host: srv.URL, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wrote *v1alpha1.Cluster
	err = Retry(t.Context(), 30*time.Second, func(ctx context.Context) error {
		c, err := lc.Cluster(ctx)
		if err != nil {
			return err
		}
		c.Spec.Releases = map[string]v1alpha1.Digest{"2026.12.01-002": v1alpha1.Digest("sha256:" + fmt.Sprintf("%064d", 0))}
		wrote, err = lc.UpdateCluster(ctx, c)
		return err
	})
	if err != nil {
		t.Fatalf("Retry: %v", err)
	}
	if puts.Load() != 2 || gets.Load() != 2 {
		t.Errorf("%d reads and %d writes, want 2 of each (the write again from a fresh read)", gets.Load(), puts.Load())
	}
	if len(wrote.Spec.Releases) != 1 {
		t.Errorf("the second write did not carry the pin: %+v", wrote.Spec)
	}
}

func TestRetryStops(t *testing.T) {
	gr := schema.GroupResource{Group: "liken.dev", Resource: "clusters"}
	for _, c := range []struct {
		name  string
		err   error
		limit time.Duration
		max   int
	}{
		// An error another try cannot mend is returned at once.
		{"forbidden", apierrors.NewForbidden(gr, "liken", fmt.Errorf("no")), time.Minute, 1},
		// A passing one is tried again only within the limit.
		{"conflict past the limit", apierrors.NewConflict(gr, "liken", fmt.Errorf("changed")), 2 * time.Second, 3},
	} {
		calls := 0
		start := time.Now()
		err := Retry(t.Context(), c.limit, func(context.Context) error {
			calls++
			return c.err
		})
		if err == nil || calls < 1 || calls > c.max {
			t.Errorf("%s: %d calls (at most %d), error %v", c.name, calls, c.max, err)
		}
		if took := time.Since(start); took > c.limit+time.Second {
			t.Errorf("%s: Retry took %s with a limit of %s", c.name, took, c.limit)
		}
	}
}
