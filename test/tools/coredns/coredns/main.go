// Command coredns is upstream CoreDNS with the plugins k3s's Corefile uses (manifests/coredns.yaml:
// errors, health, ready, kubernetes, hosts, prometheus, cache, loop, reload, loadbalance,
// forward; import is the parser's), in CoreDNS's own order (plugin.cfg), for the k3s
// stand-in's cluster DNS. k3s's image is CoreDNS with every plugin; this one refuses a
// directive outside that list (in a coredns-custom snippet, say) as an unknown one.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // the prometheus directive
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	// Execution order, as CoreDNS's plugin.cfg (core/dnsserver/zdirectives.go) has them.
	if err := dnsserver.SetDirectives([]string{"reload", "ready", "health", "prometheus", "errors", "loadbalance",
		"cache", "hosts", "kubernetes", "loop", "forward"}); err != nil {
		panic(err)
	}
	coremain.Run()
}
