//go:build !likentest

package initd

// injectTrialFault does nothing in a normal release: the faults the VM tests inject
// (fault_on.go) are built only into releases built for tests.
func (s *system) injectTrialFault() {}

// testHelperMain: a normal release runs no test helper.
func testHelperMain() bool { return false }

// startTestProcesses: a normal release starts no test process.
func (s *system) startTestProcesses() {}

// showScreen: a normal release prints nothing of its screen.
func (s *system) showScreen() {}
