package v1alpha1

// Event reasons that are no condition's (conditions.go holds those that are both).
const (
	// ReasonReleaseVerifyFailed: a downloaded file of a release did not match its pin; the
	// agent tries the download again.
	ReasonReleaseVerifyFailed = "ReleaseVerifyFailed"
	// ReasonReleaseNotSigned: the Cluster names the channel's root (spec.channelRoot) and the
	// pinned release is not what the channel's keys signed (or the signed metadata failed a
	// check); nothing of it is downloaded, and the agent checks again later.
	ReasonReleaseNotSigned = "ReleaseNotSigned"
)
