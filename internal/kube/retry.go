package kube

import (
	"context"
	"errors"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// Retry runs write (a read, a change and a conditional write) until it succeeds, fails in a
// way another try cannot mend, ctx ends, or limit has passed. A conflict (someone wrote the
// object between the read and the write) and a passing failure of the API server are tried
// again from a fresh read: a timeout, too many requests, unavailable, or a connection refused
// or reset. An API server in a small or busy machine, or one whose k3s restarts in place,
// answers that way for seconds, and an operator's command must not fail for it. A write that
// timed out may have been made: write reads first, so the next try sees it.
func Retry(ctx context.Context, limit time.Duration, write func(ctx context.Context) error) error {
	deadline := time.Now().Add(limit)
	wait := 500 * time.Millisecond
	for {
		err := write(ctx)
		if err == nil || !Passing(err) || ctx.Err() != nil {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 8*time.Second)
	}
}

// Passing tells whether err is one that another try can mend: a conflict, or the API server
// busy, restarting or out of reach for a moment.
func Passing(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err):
		return true
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		// The client's own request timeout (rest.Config.Timeout); the caller's ctx is
		// checked apart.
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
