//go:build !likentest

package initramfs

// TestSwitches: this is a normal build; liken.test.* switches do not exist (see TestBuildTag).
const TestSwitches = false
