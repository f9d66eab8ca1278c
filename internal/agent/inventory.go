package agent

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"liken.dev/liken/api/v1alpha1"
)

// inventory is the machine's hardware and network links as last read.
type inventory struct {
	hardware *v1alpha1.Hardware
	network  *v1alpha1.NetworkStatus
}

// readInventory reads the inventory and says whether it changed.
func (a *Agent) readInventory() bool {
	hw, net := a.cfg.Inventory()
	a.invMu.Lock()
	defer a.invMu.Unlock()
	changed := !equality.Semantic.DeepEqual(hw, a.inventory.hardware) || !equality.Semantic.DeepEqual(net, a.inventory.network)
	a.inventory = inventory{hardware: hw, network: net}
	return changed
}

// watchInventory reads the inventory every InventoryEvery, and has status written when it
// changed.
func (a *Agent) watchInventory(ctx context.Context) {
	every := a.cfg.InventoryEvery
	if every == 0 {
		every = 30 * time.Second
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		if a.readInventory() {
			a.queue.Add(keyReconcile)
		}
	}
}

// inventoryStatus is status.hardware and status.network.
func (a *Agent) inventoryStatus() (*v1alpha1.Hardware, *v1alpha1.NetworkStatus) {
	a.invMu.Lock()
	defer a.invMu.Unlock()
	return a.inventory.hardware.DeepCopy(), a.inventory.network.DeepCopy()
}
