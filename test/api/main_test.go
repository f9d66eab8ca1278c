// Package api holds the API-tier tests of liken's own API: the CRDs installed in a real
// kube-apiserver, checked through the real server and through the offline validator, which
// must agree.
package api

import (
	"os"
	"testing"

	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "api", apiserver.Options{}, &env)) }
