package kube

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// Watch keeps the objects lw lists and watches in a store (an informer: it lists and
// watches again after the API server restarts), and returns the store once it holds the
// first list, with a channel that receives, without piling up, each time an object is
// added, changed or deleted. For loops that act on a change rather than list on a timer.
func Watch(ctx context.Context, lw cache.ListerWatcher, obj runtime.Object) (cache.Store, <-chan struct{}, error) {
	ch := make(chan struct{}, 1)
	poke := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() }}); err != nil {
		return nil, nil, fmt.Errorf("watching %T: %w", obj, err)
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, nil, fmt.Errorf("watching %T: %w", obj, context.Cause(ctx))
	}
	return inf.GetStore(), ch, nil
}
