// Package kube is how liken talks to the Kubernetes API: a typed REST client for the
// liken.dev resources (Cluster and Machine), list-watches scoped to one object by name (all a
// machine's credentials allow), and the scheme both use.
package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"liken.dev/liken/api/v1alpha1"
)

// Scheme knows liken's kinds (and the meta kinds a list or watch of them needs). The
// built-in kinds live in client-go's own scheme; copying its sixty groups here made every
// liken command start 15 ms slower.
var Scheme = runtime.NewScheme()

func init() {
	if err := v1alpha1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
}

// Client reads and writes Clusters and Machines.
type Client struct {
	rest rest.Interface
}

// NewClient makes a Client from a client config.
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.WithoutConversionCodecFactory{CodecFactory: serializer.NewCodecFactory(Scheme)}
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("making the liken.dev client: %w", err)
	}
	return &Client{rest: rc}, nil
}

// Machine gets a Machine.
func (c *Client) Machine(ctx context.Context, name string) (*v1alpha1.Machine, error) {
	m := &v1alpha1.Machine{}
	err := c.rest.Get().Resource("machines").Name(name).Do(ctx).Into(m)
	return m, err
}

// Cluster gets the Cluster.
func (c *Client) Cluster(ctx context.Context) (*v1alpha1.Cluster, error) {
	cl := &v1alpha1.Cluster{}
	err := c.rest.Get().Resource("clusters").Name(v1alpha1.ClusterName).Do(ctx).Into(cl)
	return cl, err
}

// Machines lists every Machine.
func (c *Client) Machines(ctx context.Context) ([]v1alpha1.Machine, error) {
	l := &v1alpha1.MachineList{}
	err := c.rest.Get().Resource("machines").Do(ctx).Into(l)
	return l.Items, err
}

// UpdateMachineStatus writes m's status through the status subresource (optimistic
// concurrency on m's resourceVersion) and returns the stored object.
func (c *Client) UpdateMachineStatus(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Put().Resource("machines").Name(m.Name).SubResource("status").Body(m).Do(ctx).Into(out)
	return out, err
}

// UpdateMachine writes m (spec and metadata).
func (c *Client) UpdateMachine(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Put().Resource("machines").Name(m.Name).Body(m).Do(ctx).Into(out)
	return out, err
}

// PatchMachine patches a Machine (spec and metadata) with a JSON merge patch.
func (c *Client) PatchMachine(ctx context.Context, name string, mergePatch []byte) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Patch(types.MergePatchType).Resource("machines").Name(name).Body(mergePatch).Do(ctx).Into(out)
	return out, err
}

// PatchMachineJSON applies a JSON patch (RFC 6902) to a Machine: the API server applies it
// to the Machine as it is when the write lands, and its "test" operations make the whole
// patch fail unless what they name still holds.
func (c *Client) PatchMachineJSON(ctx context.Context, name string, jsonPatch []byte) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Patch(types.JSONPatchType).Resource("machines").Name(name).Body(jsonPatch).Do(ctx).Into(out)
	return out, err
}

// UpdateCluster writes the Cluster (spec and metadata).
func (c *Client) UpdateCluster(ctx context.Context, cl *v1alpha1.Cluster) (*v1alpha1.Cluster, error) {
	out := &v1alpha1.Cluster{}
	err := c.rest.Put().Resource("clusters").Name(cl.Name).Body(cl).Do(ctx).Into(out)
	return out, err
}

// UpdateClusterStatus writes cl's status through the status subresource, with optimistic
// concurrency on cl's resourceVersion: a write based on an older Cluster is refused with a
// conflict.
func (c *Client) UpdateClusterStatus(ctx context.Context, cl *v1alpha1.Cluster) (*v1alpha1.Cluster, error) {
	out := &v1alpha1.Cluster{}
	err := c.rest.Put().Resource("clusters").Name(cl.Name).SubResource("status").Body(cl).Do(ctx).Into(out)
	return out, err
}

// CreateMachine stores a new Machine.
func (c *Client) CreateMachine(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Post().Resource("machines").Body(m).Do(ctx).Into(out)
	return out, err
}

// DeleteMachine deletes a Machine.
func (c *Client) DeleteMachine(ctx context.Context, name string) error {
	return c.rest.Delete().Resource("machines").Name(name).Do(ctx).Error()
}

// DeleteCluster deletes the Cluster.
func (c *Client) DeleteCluster(ctx context.Context) error {
	return c.rest.Delete().Resource("clusters").Name(v1alpha1.ClusterName).Do(ctx).Error()
}

// CreateCluster stores the Cluster.
func (c *Client) CreateCluster(ctx context.Context, cl *v1alpha1.Cluster) (*v1alpha1.Cluster, error) {
	out := &v1alpha1.Cluster{}
	err := c.rest.Post().Resource("clusters").Body(cl).Do(ctx).Into(out)
	return out, err
}

// MachineListWatch lists and watches the one Machine called name.
func (c *Client) MachineListWatch(name string) cache.ListerWatcher {
	return byName(c.rest, "machines", name, func() runtime.Object { return &v1alpha1.MachineList{} })
}

// MachinesListWatch lists and watches every Machine.
func (c *Client) MachinesListWatch() cache.ListerWatcher {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			out := &v1alpha1.MachineList{}
			err := c.rest.Get().Resource("machines").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.Watch = true
			return c.rest.Get().Resource("machines").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
		},
	}
}

// ClusterListWatch lists and watches the Cluster.
func (c *Client) ClusterListWatch() cache.ListerWatcher {
	return byName(c.rest, "clusters", v1alpha1.ClusterName, func() runtime.Object { return &v1alpha1.ClusterList{} })
}

// byName is a list-watch with a metadata.name field selector: RBAC rules that name the
// object allow list and watch only in this form.
func byName(rc rest.Interface, resource, name string, newList func() runtime.Object) cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			out := newList()
			err := rc.Get().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
			return out, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			opts.Watch = true
			return rc.Get().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
		},
	}
}

// NodeListWatch lists and watches the one Node called name.
func NodeListWatch(rc rest.Interface, name string) cache.ListerWatcher {
	return cache.NewFilteredListWatchFromClient(rc, "nodes", metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	})
}

// NodeReady reports whether the Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodReady is whether p's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
