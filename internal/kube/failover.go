package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/client-go/rest"
)

// APIServerName is a name every API server's serving certificate carries, k3s's and the
// stand-in's alike (k3s puts kubernetes, kubernetes.default, ... in it): a client that may
// reach any of several servers through one URL checks each server's certificate against it.
const APIServerName = "kubernetes"

// Failover makes every connection cfg's clients open go to the first of addrs (host:port)
// that answers, in order: a server's own API server before the one it joined through; an
// agent's k3s load balancer (which fails over between the servers itself) before the server
// it joined through, for when k3s is not running. Each server is checked against
// APIServerName, as any of them may answer. With no addrs, cfg is left as it is.
func Failover(cfg *rest.Config, addrs []string) {
	if len(addrs) == 0 {
		return
	}
	cfg.TLSClientConfig.ServerName = APIServerName
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var errs []error
		for _, a := range addrs {
			c, err := d.DialContext(ctx, network, a)
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, fmt.Errorf("no API server answered: %w", errors.Join(errs...))
	}
}
