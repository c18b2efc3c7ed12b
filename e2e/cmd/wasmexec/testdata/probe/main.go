// Command probe is run by wasmexec's test under wazero: it reports what the
// WASI host gave it and exits with the code it is told to.
package main

import (
	"fmt"
	"os"
	"strconv"
)

func main() {
	wd, _ := os.Getwd()
	data, err := os.ReadFile("probe.txt") // relative to the working directory
	fmt.Printf("args=%q env=%q wd=%s file=%q err=%v\n", os.Args[1:], os.Getenv("PROBE"), wd, data, err)
	code, _ := strconv.Atoi(os.Getenv("PROBE_EXIT"))
	os.Exit(code)
}
