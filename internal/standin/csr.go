package standin

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"liken.dev/liken/internal/kube"
)

// servingApprover approves the kubelets' requests for serving certificates
// (kubernetes.io/kubelet-serving, which kube-controller-manager then signs with the server
// CA), so that the API server, which checks a kubelet's certificate against that CA, can
// reach them (logs, exec, port-forward). k3s signs serving-kubelet.crt itself in its
// supervisor, which the stand-in does not have; Kubernetes leaves the approval of these
// requests to the cluster, and asks that it check who asks for what (docs: "Kubelet serving
// certificates"). What is approved: a request from a node (system:node:NAME in system:nodes)
// for itself (CN system:node:NAME, O system:nodes), naming no host but NAME and no address
// its Node does not report, for server auth only. Anything else is left for an operator.
type servingApprover struct {
	client kubernetes.Interface
	log    io.Writer
}

// run approves what it should when a request comes or changes (a watch, as k3s's
// controllers are driven, not a list every 2 s: in an idle lab under emulation that list
// was 29 of the API server's 158 requests a minute, December 2026), and again every
// `every` while a request waits for its Node to report what it names.
func (a *servingApprover) run(ctx context.Context, every time.Duration) {
	sel := "spec.signerName=" + certificatesv1.KubeletServingSignerName
	lw := cache.NewFilteredListWatchFromClient(a.client.CertificatesV1().RESTClient(), "certificatesigningrequests", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.FieldSelector = sel })
	store, changed, err := kube.Watch(ctx, lw, &certificatesv1.CertificateSigningRequest{})
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(a.log, "k3s-standin: kubelet serving certificates: %v\n", err)
		}
		return
	}
	for {
		waiting, err := a.once(ctx, store.List())
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(a.log, "k3s-standin: kubelet serving certificates: %v\n", err)
		}
		var retry <-chan time.Time
		if waiting || err != nil {
			retry = time.After(every)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
		}
	}
}

// once approves or refuses each open request of csrs (the watch's store, not to be
// changed); waiting says whether one waits for its Node.
func (a *servingApprover) once(ctx context.Context, csrs []any) (waiting bool, err error) {
	for _, o := range csrs {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		if !ok || len(csr.Status.Conditions) > 0 {
			continue // approved or denied already
		}
		csr = csr.DeepCopy()
		node, err := a.check(ctx, csr)
		if errors.Is(err, errNotYet) {
			waiting = true // its Node has not reported it yet: look again soon
			continue
		}
		if err != nil {
			fmt.Fprintf(a.log, "k3s-standin: left %s for an operator: %v\n", csr.Name, err)
			// Not again at every look: an operator's decision, which marks it, ends it.
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "StandInRefused",
				Message: "the k3s stand-in approves a node's request for its own serving certificate only: " + err.Error()})
			if _, err := a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
				return waiting, err
			}
			continue
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "StandInApproved",
			Message: "the k3s stand-in approved node " + node + "'s serving certificate, as k3s's supervisor signs one for each node"})
		if _, err := a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return waiting, err
		}
		fmt.Fprintf(a.log, "k3s-standin: approved %s, node %s's serving certificate\n", csr.Name, node)
	}
	return waiting, nil
}

// errNotYet is a request that may be approved once its Node reports what it names.
var errNotYet = errors.New("not yet")

// check returns the node a request is from when it is one to approve.
func (a *servingApprover) check(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (string, error) {
	node, ok := strings.CutPrefix(csr.Spec.Username, "system:node:")
	if !ok || node == "" || !slices.Contains(csr.Spec.Groups, "system:nodes") {
		return "", fmt.Errorf("asked by %q, not a node", csr.Spec.Username)
	}
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth:
		default:
			return "", fmt.Errorf("usage %q is not a serving certificate's", u)
		}
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return "", errors.New("no PEM certificate request")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return "", err
	}
	if err := req.CheckSignature(); err != nil {
		return "", err
	}
	if req.Subject.CommonName != csr.Spec.Username || !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return "", fmt.Errorf("subject %q is not the asking node's", req.Subject)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return "", errors.New("e-mail or URI names")
	}
	for _, d := range req.DNSNames {
		if d != node {
			return "", fmt.Errorf("host name %q is not the node's", d)
		}
	}
	n, err := a.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("%w: its Node: %v", errNotYet, err)
	}
	for _, ip := range req.IPAddresses {
		if !slices.ContainsFunc(n.Status.Addresses, func(na corev1.NodeAddress) bool { return net.ParseIP(na.Address).Equal(ip) }) {
			return "", fmt.Errorf("%w: address %s is not one its Node reports", errNotYet, ip)
		}
	}
	return node, nil
}
