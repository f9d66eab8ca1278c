// Package bootstrap makes a new cluster's Cluster and Machines from a server's deployment
// layer. Every server runs it at every boot with a credential that may only read and
// create them: it creates what is absent and never updates or deletes anything, so once
// an object exists the API is authoritative and a later layer never reverts an operator's
// edit; a server booting with a newer layer adds the Machines that are missing.
//
// The objects are not handed to k3s's auto-deploying manifests directory: k3s applies a
// manifest file again whenever its content changes, which would overwrite the operators'
// edits with the layer's.
package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/event"
	"liken.dev/liken/internal/kube"
	"liken.dev/liken/internal/layer"
)

// Config is what a bootstrap needs.
type Config struct {
	// REST is the bootstrap credential (authority.BootstrapRBAC).
	REST *rest.Config
	// LayerDir is the server's unpacked deployment layer.
	LayerDir string
	// Server names the machine bootstrapping, for the log and the Events.
	Server string
	Log    *slog.Logger
	// Retry is the first wait between tries while the API server, or liken's CRDs in it,
	// are not there yet; it doubles up to 15 seconds. Zero means one second.
	Retry time.Duration
}

// recordName is the ConfigMap that records an object was bootstrapped.
func recordName(o runtime.Object) string {
	switch o := o.(type) {
	case *v1alpha1.Cluster:
		return "bootstrapped-cluster-" + o.Name
	case *v1alpha1.Machine:
		return "bootstrapped-machine-" + o.Name
	}
	return ""
}

func objectName(o runtime.Object) string {
	switch o := o.(type) {
	case *v1alpha1.Cluster:
		return "Cluster " + o.Name
	case *v1alpha1.Machine:
		return "Machine " + o.Name
	}
	return ""
}

// Result says what a bootstrap did.
type Result struct {
	// Created names the objects created ("Cluster liken", "Machine worker-1"); Existing
	// those that were there already and were left as they are.
	Created, Existing []string
}

// Run creates the layer's Cluster and Machines that are absent and were never bootstrapped, waiting as long as ctx
// allows for the API server and liken's CRDs (k3s applies them from its manifests after
// it starts), and records an Event on each object it created.
func Run(ctx context.Context, cfg Config) (Result, error) {
	var res Result
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Retry == 0 {
		cfg.Retry = time.Second
	}
	cluster, machines, err := layer.ReadManifests(cfg.LayerDir)
	if err != nil {
		return res, fmt.Errorf("reading the layer's manifests: %w", err)
	}
	lc, err := kube.NewClient(cfg.REST)
	if err != nil {
		return res, err
	}
	kc, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return res, err
	}
	events := event.New(event.Config{Events: kc.CoreV1().Events(authority.EventNamespace), Namespace: authority.EventNamespace,
		Scheme: kube.Scheme, Source: corev1.EventSource{Component: "liken-bootstrap", Host: cfg.Server}, Log: cfg.Log})
	sendCtx, stopSending := context.WithCancel(ctx)
	defer stopSending()
	go events.Run(sendCtx)

	objects := []runtime.Object{cluster}
	for _, m := range machines {
		objects = append(objects, m)
	}
	for _, o := range objects {
		what, made, err := create(ctx, cfg, lc, kc, o)
		if err != nil {
			return res, err
		}
		if made == nil {
			res.Existing = append(res.Existing, what)
			continue
		}
		res.Created = append(res.Created, what)
		cfg.Log.Info("bootstrap: created from the deployment layer", "object", what, "server", cfg.Server)
		events.Eventf(made, corev1.EventTypeNormal, "Bootstrapped", "%s created by server %s from its deployment layer; from now on the API is authoritative: later layers never change it", what, cfg.Server)
	}
	cfg.Log.Info("bootstrap: done", "created", res.Created, "existing", len(res.Existing))
	// The Events go out before returning (bounded: an API server that went away again does
	// not hold the server's boot).
	flushCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	events.Flush(flushCtx)
	return res, nil
}

// create makes o unless it exists, trying again while the API server or the CRDs are not
// there yet, or its record cannot be read; it returns the object made (nil when it existed).
//
// Each object made (or found) is recorded in a ConfigMap of its own in liken-system, made
// once and never changed: an object an operator deleted after it was bootstrapped is not
// made again by the next boot of a server.
func create(ctx context.Context, cfg Config, lc *kube.Client, kc kubernetes.Interface, o runtime.Object) (string, runtime.Object, error) {
	wait := cfg.Retry
	what := objectName(o)
	for {
		var made runtime.Object
		var err error
		record := recordName(o)
		cms := kc.CoreV1().ConfigMaps(v1alpha1.SecretNamespace)
		_, err = cms.Get(ctx, record, metav1.GetOptions{})
		if err == nil {
			return what, nil, nil // bootstrapped before: left as it is, or as deleted
		}
		if !apierrors.IsNotFound(err) {
			// Only a record known to be absent lets the object be made: after a Forbidden, a
			// 503 or a timeout the object may have been bootstrapped before and deleted by an
			// operator since, and making it again would undo that deletion.
			cfg.Log.Info("bootstrap: the API server, liken's CRDs or the bootstrap RBAC are not ready yet, or this object's bootstrap record cannot be read: it is made only once the record is known to be absent; trying again",
				"object", what, "record", v1alpha1.SecretNamespace+"/"+record, "in", wait, "err", err)
			select {
			case <-ctx.Done():
				return what, nil, fmt.Errorf("reading the bootstrap record %s/%s of %s: %w (last: %v)", v1alpha1.SecretNamespace, record, what, ctx.Err(), err)
			case <-time.After(wait):
			}
			wait = min(2*wait, 15*time.Second)
			continue
		}
		switch o := o.(type) {
		case *v1alpha1.Cluster:
			c := o.DeepCopy()
			c.ResourceVersion, c.Status = "", v1alpha1.ClusterStatus{}
			made, err = lc.CreateCluster(ctx, c)
		case *v1alpha1.Machine:
			m := o.DeepCopy()
			m.ResourceVersion, m.Status = "", v1alpha1.MachineStatus{}
			made, err = lc.CreateMachine(ctx, m)
		}
		if err == nil || apierrors.IsAlreadyExists(err) {
			rec := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record, Namespace: v1alpha1.SecretNamespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "liken"}},
				Data: map[string]string{"object": what, "server": cfg.Server}}
			if _, rerr := cms.Create(ctx, rec, metav1.CreateOptions{}); rerr == nil || apierrors.IsAlreadyExists(rerr) {
				if apierrors.IsAlreadyExists(err) {
					made = nil
				}
				return what, made, nil
			} else {
				err = rerr
			}
		}
		switch {
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
			// Waiting would not change these.
			return what, nil, fmt.Errorf("creating %s: %w", what, err)
		}
		// Not yet: the API server starting, liken's CRDs or the bootstrap credential's RBAC
		// not applied from k3s's manifests yet (Forbidden until then).
		cfg.Log.Info("bootstrap: the API server, liken's CRDs or the bootstrap RBAC are not ready yet; trying again", "object", what, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return what, nil, fmt.Errorf("creating %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 15*time.Second)
	}
}
