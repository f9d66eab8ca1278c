package v1alpha1

// Event reasons that are no condition's (conditions.go holds those that are both).
const (
	// ReasonReleaseVerifyFailed: a downloaded file of a release did not match its pin; the
	// agent tries the download again.
	ReasonReleaseVerifyFailed = "ReleaseVerifyFailed"
)
