//go:build likentest

package initramfs

// TestSwitches: this is a build for tests (see TestBuildTag).
const TestSwitches = true
