// Package e2e holds kvroute's end-to-end tests: the compiled filter under
// the wazero host that imitates Envoy (wasm_test.go), and real Envoy started
// through func-e with simulated engines behind it.
package e2e
