package v1alpha1

// EffectiveRebootPolicy is the reboot policy that governs m: its own, else the Cluster's,
// else Manual. The agent and the coordinator both decide from it.
func (m *Machine) EffectiveRebootPolicy(c *Cluster) RebootPolicy {
	if m.Spec.RebootPolicy != nil {
		return *m.Spec.RebootPolicy
	}
	if c.Spec.RebootPolicy != "" {
		return c.Spec.RebootPolicy
	}
	return RebootManual
}
