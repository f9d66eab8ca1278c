package v1alpha1

// Event reasons that are no condition's (conditions.go holds those that are both).
const (
	// ReasonReleaseVerifyFailed: a downloaded file of a release did not match its pin; the
	// agent tries the download again.
	ReasonReleaseVerifyFailed = "ReleaseVerifyFailed"
	// ReasonGateFailed: after its reboot, a machine's gates (spec.rollout.gates, or the
	// workloads that ran on it) failed or did not pass in time; also the reason of the
	// failure the coordinator records in status.rollout.gateFailures.
	ReasonGateFailed = "GateFailed"
)
