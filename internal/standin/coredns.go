package standin

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"liken.dev/liken/internal/kube"
)

// coreDNSManifest is k3s's manifests/coredns.yaml (docs/research/coredns.md, k3s 469d009) with
// the values k3s substitutes at start (pkg/server/server.go stageFiles: CLUSTER_DNS,
// CLUSTER_DNS_LIST, CLUSTER_DNS_IPFAMILYPOLICY, CLUSTER_DOMAIN) and the image the stand-in
// release carries in place of rancher/mirrored-coredns-coredns (CoreDNS with only the
// Corefile's plugins, test/tools/coredns).
func coreDNSManifest(clusterDNS, clusterDomain, image string) ([]byte, error) {
	if net.ParseIP(clusterDNS) == nil {
		return nil, fmt.Errorf("cluster-dns %q is not an address", clusterDNS)
	}
	r := strings.NewReplacer("%{CLUSTER_DNS}%", clusterDNS, "%{CLUSTER_DNS_LIST}%", "["+clusterDNS+"]",
		"%{CLUSTER_DNS_IPFAMILYPOLICY}%", "SingleStack", "%{CLUSTER_DOMAIN}%", clusterDomain, "%{IMAGE}%", image)
	return []byte(r.Replace(coreDNSTemplate)), nil
}

// nodeHostsLoop keeps kube-system/coredns's NodeHosts key, which CoreDNS's hosts plugin reads,
// listing each Node's internal addresses and name, as k3s's node controller does
// (pkg/node/controller.go): "<ip> <node>" lines, sorted. It writes them when a Node
// changes (a watch, as k3s's controller is driven, not a list every 5 s), and looks again
// after `every` while the ConfigMap is not there yet (the deployer makes it) or a write
// failed.
func nodeHostsLoop(ctx context.Context, client kubernetes.Interface, log io.Writer, every time.Duration) {
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything())
	store, changed, err := kube.Watch(ctx, lw, &corev1.Node{})
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(log, "k3s-standin: NodeHosts: %v\n", err)
		}
		return
	}
	for {
		var retry <-chan time.Time
		if err := writeNodeHosts(ctx, client, store.List()); err != nil && ctx.Err() == nil {
			retry = time.After(every)
			if !apierrors.IsNotFound(err) {
				fmt.Fprintf(log, "k3s-standin: NodeHosts: %v\n", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		}
	}
}

// writeNodeHosts writes the NodeHosts of nodes (the watch's store) when they differ.
func writeNodeHosts(ctx context.Context, client kubernetes.Interface, nodes []any) error {
	var lines []string
	for _, o := range nodes {
		n, ok := o.(*corev1.Node)
		if !ok {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				lines = append(lines, a.Address+" "+n.Name)
			}
		}
	}
	sort.Strings(lines)
	want := strings.Join(lines, "\n") + "\n"
	cms := client.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	if err != nil {
		return err // not applied yet: the deployer makes it
	}
	if cm.Data["NodeHosts"] == want {
		return nil
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["NodeHosts"] = want
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

const coreDNSTemplate = `apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  annotations:
    rbac.authorization.kubernetes.io/autoupdate: "true"
  labels:
    kubernetes.io/bootstrapping: rbac-defaults
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    # File managed by the k3s stand-in, as k3s manages its own.
    .:53 {
        errors
        health
        ready
        kubernetes %{CLUSTER_DOMAIN}% in-addr.arpa ip6.arpa {
          pods insecure
          fallthrough in-addr.arpa ip6.arpa
        }
        hosts /etc/coredns/NodeHosts {
          ttl 60
          reload 15s
          fallthrough
        }
        prometheus :9153
        cache 30
        loop
        reload
        loadbalance
        import /etc/coredns/custom/*.override
        forward . /etc/resolv.conf
    }
    import /etc/coredns/custom/*.server
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: "CoreDNS"
spec:
  revisionHistoryLimit: 0
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      priorityClassName: "system-cluster-critical"
      serviceAccountName: coredns
      tolerations:
        - key: "CriticalAddonsOnly"
          operator: "Exists"
        - key: "node-role.kubernetes.io/control-plane"
          operator: "Exists"
          effect: "NoSchedule"
      nodeSelector:
        kubernetes.io/os: linux
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels:
              k8s-app: kube-dns
        - maxSkew: 1
          topologyKey: topology.kubernetes.io/zone
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              k8s-app: kube-dns
      containers:
      - name: coredns
        image: "%{IMAGE}%"
        imagePullPolicy: IfNotPresent
        resources:
          limits:
            memory: 170Mi
          requests:
            cpu: 100m
            memory: 70Mi
        args: [ "-conf", "/etc/coredns/Corefile" ]
        volumeMounts:
        - name: config-volume
          mountPath: /etc/coredns
          readOnly: true
        - name: custom-config-volume
          mountPath: /etc/coredns/custom
          readOnly: true
        ports:
        - containerPort: 53
          name: dns
          protocol: UDP
        - containerPort: 53
          name: dns-tcp
          protocol: TCP
        - containerPort: 9153
          name: metrics
          protocol: TCP
        securityContext:
          allowPrivilegeEscalation: false
          capabilities:
            add:
            - NET_BIND_SERVICE
            drop:
            - all
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet:
            path: /health
            port: 8080
            scheme: HTTP
          initialDelaySeconds: 60
          periodSeconds: 10
          timeoutSeconds: 1
          successThreshold: 1
          failureThreshold: 3
        readinessProbe:
          httpGet:
            path: /ready
            port: 8181
            scheme: HTTP
          initialDelaySeconds: 0
          periodSeconds: 2
          timeoutSeconds: 1
          successThreshold: 1
          failureThreshold: 3
      dnsPolicy: Default
      volumes:
        - name: config-volume
          configMap:
            name: coredns
            items:
            - key: Corefile
              path: Corefile
            - key: NodeHosts
              path: NodeHosts
        - name: custom-config-volume
          configMap:
            name: coredns-custom
            optional: true
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  annotations:
    prometheus.io/port: "9153"
    prometheus.io/scrape: "true"
  labels:
    k8s-app: kube-dns
    kubernetes.io/cluster-service: "true"
    kubernetes.io/name: "CoreDNS"
spec:
  selector:
    k8s-app: kube-dns
  clusterIP: %{CLUSTER_DNS}%
  clusterIPs: %{CLUSTER_DNS_LIST}%
  ports:
  - name: dns
    port: 53
    protocol: UDP
  - name: dns-tcp
    port: 53
    protocol: TCP
  - name: metrics
    port: 9153
    protocol: TCP
  ipFamilyPolicy: %{CLUSTER_DNS_IPFAMILYPOLICY}%
`
