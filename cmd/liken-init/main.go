// Command liken-init is PID 1 on every liken machine (see internal/initd).
package main

import "liken.dev/liken/internal/initd"

func main() { initd.Main() }
