package apiserver

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Main is a TestMain body: it starts a control plane, stores it in *env, runs the package's
// tests, stops it, and reports the start-up times under the package's name.
//
//	var env *apiserver.Env
//	func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "agent", apiserver.Options{}, &env)) }
func Main(m *testing.M, pkg string, opts Options, env **Env) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	e, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the test control plane: %v\n", err)
		return 1
	}
	*env = e
	Report("apiserver[%s]: tools %s, etcd+kube-apiserver ready in %s, CRDs in %s, total %s",
		pkg, e.Timings.Tools.Round(time.Millisecond), e.Timings.Ready.Round(time.Millisecond),
		e.Timings.CRDs.Round(time.Millisecond), e.Timings.Total.Round(time.Millisecond))
	code := m.Run()
	e.Stop()
	return code
}
